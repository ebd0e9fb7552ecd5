"""`python -m ragen_lit diagnose`: the template-collapse MI family (ragen2.md §3) of a model on a rollouts file.

Input is JSONL, one object per reasoning sample, the format `fit` writes with `logging.save_rollouts=true`:
`prompt` (decoded prompt text with its chat markup, ending with the opening `<think>`), `reasoning`
(the text inside `<think>…</think>`) and `group` (int or str; rows of one group share one prompt).
Other fields are ignored; blank lines are skipped silently. Both texts are tokenized with
`add_special_tokens=False`, since the prompt text already holds the chat markup.

Columns are the distinct groups, in order of first appearance; a column's prompt is its group's first
usable row's prompt, and a row's true column is its group's. Columns whose prompts are token-identical form
one column group (a hit on any copy counts), exactly as in training (`diagnostics.column_groups_of`).

A bad row is skipped and counted by reason, with its first line numbers, in the report: a line that is
not a JSON object, a missing or ill-typed field, reasoning that tokenizes to nothing, a row too long to score
(below), or a prompt whose tokens differ from its group's first usable prompt. The last one breaks the file's
promise that a group is one prompt: scoring that row against its group's column would measure the wrong pair,
and giving it a column of its own would silently change N and the chance level, so the row is dropped instead.
Problems with the file or the model as a whole raise `ConfigError` (one line on stderr, exit code 2): the file
is missing or unreadable, no row is usable, fewer than 2 distinct prompts remain, or the model cannot be loaded.

Every reasoning is scored under every column prompt, so each pair must fit the token limit: the model's context
length, or `--max-tokens` where that is lower. A row whose prompt + reasoning exceeds it is skipped, and so is a
row whose reasoning does not fit after the longest column prompt (a column prompt comes from a row that fits, so
dropping these rows never leaves a pair too long). The check is cheap for any row size: a row with more
characters than the limit times the longest token's length in characters (a bound that holds for tokenizers that
do not drop characters: byte-level BPE, SentencePiece, WordPiece) cannot fit and is skipped before it is
tokenized, and every text tokenized is therefore bounded.

`--model` takes a run folder or one of its checkpoints as well (`ragen_lit.checkpoints`): the trained policy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ragen_lit.checkpoints import is_run_or_checkpoint, load_trained_policy
from ragen_lit.config import MODEL_PRESETS, ConfigError, DiagnosticsConfig, ModelConfig
from ragen_lit.typed_fields import check_fields, checked, flag

DTYPES = ("float32", "bfloat16")  # the names of `models.DTYPES` that --dtype accepts
_LINES_SHOWN = 3  # line numbers quoted per skip reason
_BUDGET = next(f for f in dataclasses.fields(DiagnosticsConfig) if f.name == "max_tokens_per_forward")


@dataclass
class DiagnoseOptions:
    """The options of `python -m ragen_lit diagnose`; each field is the flag `--<name with dashes>`."""

    model: str
    """HF id or model folder, a preset (tiny, smollm2-135m), a run folder (its last.ckpt) or a checkpoint"""
    rollouts: str
    """JSONL: one {prompt, reasoning, group} per line"""
    max_tokens: int = checked(0, ge=0)
    """rows whose prompt + reasoning exceed this many tokens are skipped and counted; 0 = the model's context"""
    max_tokens_per_forward: int = checked(_BUDGET.default, **_BUDGET.metadata)
    """padded tokens per scoring forward (memory bound); 0 = auto, as for diagnostics.max_tokens_per_forward"""
    dtype: str = checked("float32", choices=DTYPES)
    """parameter dtype"""
    max_rows: int | None = checked(None, ge=1)
    """score a seeded random subsample of this many rows (cost: rows x groups pairs)"""
    seed: int = 0
    """seed of the --max-rows subsample"""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda | cuda:1 ..."""


@dataclass
class RolloutRow:
    """One usable line of the rollouts file (1-based `line`)."""

    line: int
    prompt: str
    reasoning: str
    group: int | str


@dataclass
class SkippedRows:
    """Rows left out, counted per reason, with the first few line numbers of each reason."""

    counts: Counter = field(default_factory=Counter)
    lines: dict[str, list[int]] = field(default_factory=dict)

    def add(self, reason: str, line: int) -> None:
        self.counts[reason] += 1
        shown = self.lines.setdefault(reason, [])
        if len(shown) < _LINES_SHOWN:
            shown.append(line)

    def total(self) -> int:
        return sum(self.counts.values())

    def describe(self) -> list[str]:
        """One line per reason: `<count>: <reason> (lines 3, 7, …)`, most frequent first."""
        out = []
        for reason, count in self.counts.most_common():
            shown = ", ".join(str(n) for n in self.lines[reason]) + (", …" if count > len(self.lines[reason]) else "")
            out.append(f"{count}: {reason} (line{'s' if count > 1 else ''} {shown})")
        return out


@dataclass
class DiagnoseResult:
    """What `diagnose_rollouts` measured: the `MIDiagnostics` values and the row/column counts."""

    values: dict[str, float]
    rows_read: int
    rows_used: int
    num_columns: int
    num_distinct_prompts: int
    skipped: SkippedRows
    subsampled_from: int | None = None


def read_rollouts(path: str | os.PathLike) -> tuple[list[RolloutRow], SkippedRows, int]:
    """Parse the JSONL file: (usable rows, skipped rows, number of non-blank lines read).

    Raises `ConfigError` if the file cannot be read as UTF-8 text."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--rollouts {str(path)!r}: no such file" + (" (it is a directory)" if path.is_dir() else ""))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--rollouts {str(path)!r}: cannot read it as UTF-8 text ({err})") from None
    rows, skipped, read = [], SkippedRows(), 0
    # split on "\n" only: str.splitlines would also cut at U+2028 etc., which JSON strings may hold raw
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        read += 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            skipped.add("not valid JSON", number)
            continue
        if not isinstance(record, dict):
            skipped.add("not a JSON object", number)
            continue
        problem = _field_problem(record)
        if problem:
            skipped.add(problem, number)
            continue
        rows.append(RolloutRow(number, record["prompt"], record["reasoning"], record["group"]))
    return rows, skipped, read


def _field_problem(record: dict) -> str | None:
    """Why a parsed object is not a usable row, or None."""
    for name in ("prompt", "reasoning", "group"):
        if name not in record:
            return f"missing field {name!r}"
    for name in ("prompt", "reasoning"):
        if not isinstance(record[name], str):
            return f"field {name!r} is not a string"
    group = record["group"]
    # bool is an int and 1.0 == 1 as a dict key: both would merge groups silently
    if isinstance(group, bool) or not isinstance(group, (int, str)):
        return "field 'group' is not an int or string"
    if not record["prompt"]:
        return "empty prompt"
    if not record["reasoning"]:
        return "empty reasoning"
    return None


def diagnose_rollouts(
    policy,
    tokenizer,
    rows: list[RolloutRow],
    skipped: SkippedRows,
    rows_read: int,
    *,
    max_tokens: int = 0,
    max_tokens_per_forward: int = 0,
    max_rows: int | None = None,
    seed: int = 0,
) -> DiagnoseResult:
    """Tokenize, build columns, cross-score every reasoning under every column prompt, compute the family.

    Args:
        policy: HF causal LM (scored in eval mode, no grad).
        tokenizer: its tokenizer (`pad_token_id` set).
        rows / skipped / rows_read: from `read_rollouts`; `skipped` gains the rows dropped here.
        max_tokens: a lower token limit per pair than the model's context (0: the context); see the module
            docstring.
        max_tokens_per_forward: the scorer's memory bound, 0 = auto (`metrics.collapse.tokens_per_forward`).
        max_rows: score a uniform subsample of this many usable rows (`random.Random(seed)`), drawn
            after the row checks so that the skip counts describe the whole file.

    Raises `ConfigError` when no row is usable or fewer than 2 distinct prompts remain.
    """
    import torch

    from ragen_lit.metrics import MIDiagnostics, cross_score
    from ragen_lit.metrics.collapse import column_groups_of, tokens_per_forward

    limit = _limit(policy, max_tokens)
    tokenized = _fit_longest_prompt(_tokenize_rows(tokenizer, rows, skipped, limit), limit, skipped)
    if not tokenized:
        raise ConfigError(f"no usable rows in the rollouts file ({_skip_summary(skipped, rows_read)})")
    subsampled_from = None
    if max_rows is not None and len(tokenized) > max_rows:
        subsampled_from = len(tokenized)
        keep = sorted(random.Random(seed).sample(range(len(tokenized)), max_rows))
        tokenized = [tokenized[i] for i in keep]

    column_of: dict[int | str, int] = {}
    prompts: list[list[int]] = []
    for prompt_ids, _, group, _ in tokenized:
        if group not in column_of:
            column_of[group] = len(prompts)
            prompts.append(prompt_ids)
    column_groups = column_groups_of(prompts)
    num_distinct = int(column_groups.max()) + 1
    if num_distinct < 2:
        where = f" after subsampling to --max-rows {max_rows}" if subsampled_from else ""
        raise ConfigError(
            f"the MI diagnostics compare prompts, but the usable rows{where} hold {num_distinct} distinct prompt "
            f"({len(prompts)} group{'s' if len(prompts) > 1 else ''}); need rows from at least 2 distinct prompts"
        )
    reasonings = [reasoning_ids for _, reasoning_ids, _, _ in tokenized]
    target = torch.tensor([column_of[group] for _, _, group, _ in tokenized], dtype=torch.long)

    print(
        f"scoring {len(reasonings)} reasonings x {len(prompts)} prompts = {len(reasonings) * len(prompts)} pairs "
        f"on {next(policy.parameters()).device}",
        file=sys.stderr,
    )
    policy.eval()
    l_tok, l_sum = cross_score(
        policy,
        prompts,
        reasonings,
        max_tokens_per_forward=tokens_per_forward(policy, max_tokens_per_forward),
        pad_token_id=tokenizer.pad_token_id,
    )
    if not (torch.isfinite(l_tok).all() and torch.isfinite(l_sum).all()):
        raise ConfigError("the model gave non-finite log-probabilities (NaN/inf); try --dtype float32")
    metric = MIDiagnostics()
    metric.update(l_tok.double().cpu(), l_sum.double().cpu(), target, column_groups=column_groups)
    values = {name: float(value) for name, value in metric.compute().items()}
    return DiagnoseResult(values, rows_read, len(tokenized), len(prompts), num_distinct, skipped, subsampled_from)


@dataclass
class TokenLimit:
    """The most prompt + reasoning tokens of one scored pair, and where that number comes from."""

    tokens: int
    source: str

    def reason(self, what: str) -> str:
        return f"{what} over the {self.tokens}-token limit ({self.source})"


def _limit(policy, max_tokens: int) -> TokenLimit:
    from ragen_lit.models import context_length

    context = context_length(policy.config)
    if max_tokens and (context is None or max_tokens < context):
        return TokenLimit(max_tokens, flag("max_tokens"))
    if context is None:
        raise ConfigError(
            f"the model's config states no context length (max_position_embeddings); give {flag('max_tokens')}"
        )
    return TokenLimit(context, "the model's context")


def _max_chars_per_token(tokenizer) -> int:
    """The longest vocabulary entry in characters: no token covers more characters of the text, so a text of
    c characters has at least c / this many tokens (for tokenizers that do not drop characters)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1


Tokenized = tuple[list[int], list[int], int | str, int]  # prompt ids, reasoning ids, group, line


def _tokenize_rows(tokenizer, rows: list[RolloutRow], skipped: SkippedRows, limit: TokenLimit) -> list[Tokenized]:
    """The rows that pass the token-level checks. A row with more characters than the limit can cover is
    skipped without being tokenized (see the module docstring)."""
    too_long = limit.reason("prompt + reasoning")
    max_chars = limit.tokens * _max_chars_per_token(tokenizer)
    group_prompt: dict[int | str, list[int]] = {}
    out = []
    for row in rows:
        if len(row.prompt) + len(row.reasoning) > max_chars:
            skipped.add(too_long, row.line)
            continue
        # verbose=False: a text longer than the tokenizer's model_max_length is skipped here, not worth a warning
        prompt_ids = list(tokenizer.encode(row.prompt, add_special_tokens=False, verbose=False))
        reasoning_ids = list(tokenizer.encode(row.reasoning, add_special_tokens=False, verbose=False))
        if len(prompt_ids) + len(reasoning_ids) > limit.tokens:
            skipped.add(too_long, row.line)
        elif not prompt_ids:
            skipped.add("prompt has no tokens", row.line)
        elif not reasoning_ids:
            skipped.add("reasoning has no tokens", row.line)
        elif group_prompt.setdefault(row.group, prompt_ids) != prompt_ids:
            skipped.add("prompt differs from its group's first prompt", row.line)
        else:
            out.append((prompt_ids, reasoning_ids, row.group, row.line))
    return out


def _fit_longest_prompt(rows: list[Tokenized], limit: TokenLimit, skipped: SkippedRows) -> list[Tokenized]:
    """Drop the rows whose reasoning does not fit the limit after the longest column prompt (each group's first
    row's prompt). The longest prompt of the rows kept is no longer, so every pair left fits."""
    columns: dict[int | str, int] = {}
    for prompt_ids, _, group, _ in rows:
        columns.setdefault(group, len(prompt_ids))
    longest = max(columns.values(), default=0)
    reason = limit.reason(f"reasoning + the longest prompt ({longest} tokens)")
    kept = []
    for row in rows:
        if len(row[1]) + longest > limit.tokens:
            skipped.add(reason, row[3])
        else:
            kept.append(row)
    return kept


def _skip_summary(skipped: SkippedRows, rows_read: int) -> str:
    if not rows_read:
        return "the file has no non-blank lines"
    reasons = "; ".join(
        f"{count} {reason} (first at line {skipped.lines[reason][0]})" for reason, count in skipped.counts.most_common()
    )
    return f"{rows_read} lines read, all skipped: {reasons}"


# (metric, chance, upper bound): chance/upper bound are a value or a key of the computed values;
# "no prompt information" is 0 for the MI estimates and z-scores.
_TABLE = (
    ("retrieval_acc", "retrieval_chance", 1.0),
    ("recall@2", "recall@2_chance", 1.0),
    ("recall@4", "recall@4_chance", 1.0),
    ("recall@8", "recall@8_chance", 1.0),
    ("mi_est", 0.0, "mi_upper_bound"),
    ("mi_seq_est", 0.0, "mi_upper_bound"),
    ("mi_zscore", 0.0, None),
    ("mi_zscore_ema", 0.0, None),
    ("mi_zscore_seq", 0.0, None),
    ("mi_zscore_ema_seq", 0.0, None),
    ("cond_entropy", None, None),
    ("reasoning_entropy", None, None),
    ("cond_entropy_seq", None, None),
    ("reasoning_entropy_seq", None, None),
    ("matched_logprob", None, None),
    ("marginal_logprob", None, None),
    ("marginal_std", None, None),
    ("matched_logprob_seq", None, None),
    ("marginal_logprob_seq", None, None),
    ("marginal_std_seq", None, None),
)
# shown as their own columns (or in the header) rather than as rows
_NOT_ROWS_SUFFIXES = ("_chance", "_above_chance")
_HEADER_KEYS = ("mi_upper_bound", "num_rows", "num_columns")


def table_rows(values: dict[str, float]) -> list[tuple[str, float, float | None, float | None, float | None]]:
    """(metric, value, chance, above chance, upper bound) for every metric in `values`: the known ones in
    `_TABLE` order, then any others the metric family gained, without chance or bound."""

    def lookup(spec):
        return values.get(spec) if isinstance(spec, str) else spec

    out = []
    for name, chance_spec, bound_spec in _TABLE:
        if name in values:
            chance = lookup(chance_spec)
            out.append(
                (name, values[name], chance, None if chance is None else values[name] - chance, lookup(bound_spec))
            )
    known = {name for name, _, _ in _TABLE}
    for name, value in values.items():
        if name not in known and name not in _HEADER_KEYS and not name.endswith(_NOT_ROWS_SUFFIXES):
            out.append((name, value, None, None, None))
    return out


def format_report(result: DiagnoseResult, model: str, rollouts: str) -> str:
    """The printed report: counts, then the aligned metric table."""
    values = result.values
    skipped = result.skipped.total()
    lines = [
        "MI collapse diagnostics (ragen2.md §3)",
        f"model      {model}",
        f"rollouts   {rollouts}",
        f"rows       {result.rows_used} used, {skipped} skipped, of {result.rows_read} read",
        *(f"  skipped {line}" for line in result.skipped.describe()),
    ]
    if result.subsampled_from is not None:
        lines.append(f"           (a seeded subsample of {result.rows_used} of {result.subsampled_from} usable rows)")
    lines += [
        f"columns    {result.num_columns} groups, {result.num_distinct_prompts} distinct prompts;"
        f" MI upper bound log N = {values['mi_upper_bound']:.4f}",
        "",
    ]
    header = ("metric", "value", "chance", "above chance", "upper bound")
    cells = [header] + [
        (name, _number(value), _number(chance), _number(above, signed=True), _number(bound))
        for name, value, chance, above, bound in table_rows(values)
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        lines.append(
            "  ".join([row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:]))]).rstrip()
        )
    return "\n".join(lines)


def _number(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def resolve_model(model: str) -> str:
    """Folder or hub id to load: a preset name (`tiny`, `smollm2-135m`) or the argument itself.

    Raises `ConfigError` for a local path that is missing or is not a model folder."""
    from ragen_lit.presets import resolve_model_path

    if model in MODEL_PRESETS:
        return resolve_model_path(ModelConfig(name=model))
    looks_local = os.path.isabs(model) or model.startswith((".", "~")) or os.path.exists(model)
    path = os.path.expanduser(model)
    if looks_local and not os.path.isdir(path):
        raise ConfigError(
            f"--model {model!r}: no such folder (give an HF id, a model folder, a run folder or checkpoint, or one "
            f"of {MODEL_PRESETS})"
        )
    if looks_local and not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"--model {model!r}: the folder holds no config.json, so it is not an HF model folder")
    return path if looks_local else model


def run_diagnose(options: DiagnoseOptions) -> int:
    """Load the model, score the rollouts file, print the report; returns the exit code (0).

    Raises `ConfigError` for a bad option, file or model (see the module docstring)."""
    check_fields(options, flag)
    rollouts, device = options.rollouts, options.device
    rows, skipped, rows_read = read_rollouts(rollouts)
    if not rows:
        raise ConfigError(f"no usable rows in {rollouts!r} ({_skip_summary(skipped, rows_read)})")

    import torch

    from ragen_lit.models import load_policy, load_tokenizer

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"--device {device!r}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {str(device)!r}: CUDA is not available here (use --device cpu)")
    if is_run_or_checkpoint(options.model):
        trained = load_trained_policy(options.model, options.dtype, flag("model"))
        print(f"policy of {trained.checkpoint} (base model {trained.base})", file=sys.stderr)
        policy, tokenizer = trained.policy.to(device), trained.tokenizer
    else:
        path = resolve_model(options.model)
        tokenizer = _load(load_tokenizer, path)
        policy = _load(load_policy, path, options.dtype).to(device)
    result = diagnose_rollouts(
        policy,
        tokenizer,
        rows,
        skipped,
        rows_read,
        max_tokens=options.max_tokens,
        max_tokens_per_forward=options.max_tokens_per_forward,
        max_rows=options.max_rows,
        seed=options.seed,
    )
    print(format_report(result, options.model, rollouts))
    return 0


def _load(loader, *args):
    # `models` turns a missing folder (OSError) into ConfigError; a folder without the right files
    # makes transformers raise ValueError instead, which is just as much the user's argument
    try:
        return loader(*args)
    except ConfigError:
        raise
    except (OSError, ValueError) as err:
        raise ConfigError(f"--model {args[0]!r}: cannot load it ({str(err).splitlines()[0]})") from None
