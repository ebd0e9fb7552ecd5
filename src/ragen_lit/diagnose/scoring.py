"""The MI family of a model on read rollout rows: the rows tokenized and checked against the token limit, the columns
built from their groups, every reasoning cross-scored under every column prompt (`diagnose_rollouts`)."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass

from ragen_lit.config.typed_fields import flag
from ragen_lit.diagnose.rollouts import RolloutRow, SkippedRows, skip_summary
from ragen_lit.errors import ConfigError


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
        raise ConfigError(f"no usable rows in the rollouts file ({skip_summary(skipped, rows_read)})")
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
