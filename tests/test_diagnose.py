"""`python -m ragen_lit diagnose`: report, skip counts and clear errors on a tiny random Qwen2 model folder."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from ragen_lit.cli import main
from ragen_lit.config import DiagnosticsConfig
from ragen_lit.diagnose import DiagnoseOptions, diagnose_rollouts, read_rollouts, run_diagnose, table_rows
from ragen_lit.models import load_policy, load_tokenizer

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USERS = ("the lake is frozen, go left", "you stand on the ice, go up", "a hole is below you, go right")
FAMILY = (
    "retrieval_acc",
    "recall@2",
    "mi_est",
    "mi_seq_est",
    "mi_zscore",
    "mi_zscore_ema",
    "cond_entropy",
    "reasoning_entropy",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML template and a random 2-layer Qwen2, saved as an HF folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("tiny_qwen2")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([*USERS, "system user assistant <think> I should go"], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_policy(model_dir, "float32"), load_tokenizer(model_dir)


def prompt_text(tokenizer, user: str) -> str:
    messages = [{"role": "system", "content": "You walk on a frozen lake."}, {"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"


def good_records(tokenizer) -> list[dict]:
    """3 groups x 2 reasoning samples, plus the extra fields `fit` writes."""
    return [
        {
            "prompt": prompt_text(tokenizer, user),
            "reasoning": f"I should go {word} now",
            "group": g,
            "turn": 1,
            "trajectory": 2 * g + k,
            "seed": g,
            "reward": 0.0,
        }
        for g, user in enumerate(USERS)
        for k, word in enumerate(("left", "up"))
    ]


def write_jsonl(path, lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def naive_scores(model, tokenizer, prompts: list[str], reasonings: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """L_tok, L_sum [R, N] float64, one full-logits forward per pair."""
    l_sum = torch.zeros(len(reasonings), len(prompts), dtype=torch.float64)
    lengths = []
    with torch.no_grad():
        for r, reasoning in enumerate(reasonings):
            z = tokenizer.encode(reasoning, add_special_tokens=False)
            lengths.append(len(z))
            for j, prompt in enumerate(prompts):
                x = tokenizer.encode(prompt, add_special_tokens=False)
                logits = model(torch.tensor([x + z])).logits[0].double().log_softmax(-1)
                l_sum[r, j] = sum(logits[len(x) + t - 1, token] for t, token in enumerate(z))
    return l_sum / torch.tensor(lengths, dtype=torch.float64)[:, None], l_sum


def test_values_match_an_independent_computation_with_duplicate_prompts(loaded, tmp_path):
    """Groups 0 and 3 hold the same prompt text: 4 columns, 3 distinct prompts, and rows of groups 0 and 3
    count a hit on either column, so chance = (4 rows · 2/4 + 4 rows · 1/4) / 8 = 0.375."""
    model, tokenizer = loaded
    records = good_records(tokenizer) + [
        {"prompt": prompt_text(tokenizer, USERS[0]), "reasoning": f"left {word} and on", "group": "g3"}
        for word in ("now", "then")
    ]
    rows, skipped, read = read_rollouts(write_jsonl(tmp_path / "r.jsonl", records))
    result = diagnose_rollouts(model, tokenizer, rows, skipped, read)

    columns = [records[0]["prompt"], records[2]["prompt"], records[4]["prompt"], records[6]["prompt"]]
    target = [0, 0, 1, 1, 2, 2, 3, 3]
    equivalent = [[0, 3], [0, 3], [1], [1], [2], [2], [0, 3], [0, 3]]
    l_tok, l_sum = naive_scores(model, tokenizer, columns, [rec["reasoning"] for rec in records])

    def mi(scores):
        matched = [scores[r, target[r]].item() for r in range(8)]
        marginal = [math.log(sum(math.exp(v) for v in scores[r].tolist()) / 4) for r in range(8)]
        return sum(matched) / 8 - sum(marginal) / 8, marginal

    hits = sum(max(range(4), key=lambda j: (l_tok[r, j].item(), -j)) in equivalent[r] for r in range(8))
    mi_tok, marginal = mi(l_tok)
    std = math.sqrt(sum(m * m for m in marginal) / 8 - (sum(marginal) / 8) ** 2)
    values = result.values
    assert (result.rows_read, result.rows_used, result.num_columns, result.num_distinct_prompts) == (8, 8, 4, 3)
    assert values["retrieval_acc"] == pytest.approx(hits / 8, abs=1e-12)
    assert values["retrieval_chance"] == pytest.approx(0.375, abs=1e-12)
    assert values["mi_est"] == pytest.approx(mi_tok, abs=1e-5)
    assert values["mi_seq_est"] == pytest.approx(mi(l_sum)[0], abs=1e-3)
    assert values["mi_zscore"] == pytest.approx(mi_tok / (std + 1e-3), abs=1e-3)
    assert values["cond_entropy"] == pytest.approx(-sum(l_tok[r, target[r]].item() for r in range(8)) / 8, abs=1e-5)
    assert values["mi_upper_bound"] == pytest.approx(math.log(4), abs=1e-12)


def test_report_prints_the_family_with_chance_levels(model_dir, loaded, tmp_path, capsys):
    _, tokenizer = loaded
    path = write_jsonl(tmp_path / "good.jsonl", good_records(tokenizer))
    assert run_diagnose(DiagnoseOptions(model_dir, path, max_tokens_per_forward=64)) == 0
    out = capsys.readouterr().out
    assert "rows       6 used, 0 skipped, of 6 read" in out
    assert "columns    3 groups, 3 distinct prompts; MI upper bound log N = 1.0986" in out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines()[out.splitlines().index("") + 2 :]}
    assert set(FAMILY) <= set(table)
    for name, cells in table.items():
        assert math.isfinite(float(cells[0])), name
    value, chance, above, bound = table["retrieval_acc"]
    assert (chance, bound) == ("0.3333", "1.0000")
    assert float(above) == pytest.approx(float(value) - 1 / 3, abs=2e-4)
    assert table["recall@2"][1] == "0.6667"
    assert table["mi_est"][1::2] == ["0.0000", "1.0986"]
    assert table["cond_entropy"][1:] == ["-", "-", "-"]


def test_bad_rows_are_skipped_and_counted(loaded, tmp_path):
    model, tokenizer = loaded
    prompt = prompt_text(tokenizer, USERS[0])
    lines = good_records(tokenizer) + [
        "",  # blank lines are not rows
        "{not json",
        "[1, 2]",
        {"prompt": prompt, "group": 0},
        {"prompt": prompt, "reasoning": 3, "group": 0},
        {"prompt": prompt, "reasoning": "go", "group": None},
        {"prompt": prompt, "reasoning": "go", "group": True},
        {"prompt": prompt, "reasoning": "", "group": 0},
        {"prompt": prompt, "reasoning": "", "group": 1},
        {"prompt": prompt_text(tokenizer, USERS[2]), "reasoning": "go", "group": 0},
    ]
    rows, skipped, read = read_rollouts(write_jsonl(tmp_path / "r.jsonl", lines))
    result = diagnose_rollouts(model, tokenizer, rows, skipped, read)
    assert (result.rows_read, result.rows_used, result.num_columns) == (15, 6, 3)
    assert dict(result.skipped.counts) == {
        "not valid JSON": 1,
        "not a JSON object": 1,
        "missing field 'reasoning'": 1,
        "field 'reasoning' is not a string": 1,
        "field 'group' is not an int or string": 2,
        "empty reasoning": 2,
        "prompt differs from its group's first prompt": 1,
    }
    assert result.skipped.lines["empty reasoning"] == [14, 15]
    assert "2: empty reasoning (lines 14, 15)" in result.skipped.describe()


def test_max_rows_subsample_is_seeded(loaded, tmp_path):
    model, tokenizer = loaded
    rows, skipped, read = read_rollouts(write_jsonl(tmp_path / "r.jsonl", good_records(tokenizer)))
    first = diagnose_rollouts(model, tokenizer, rows, skipped, read, max_rows=4, seed=3)
    again = diagnose_rollouts(model, tokenizer, rows, skipped, read, max_rows=4, seed=3)
    assert (first.rows_used, first.subsampled_from) == (4, 6)
    assert first.values == again.values


def test_extra_metrics_get_a_row_without_chance():
    values = {"retrieval_acc": 0.5, "retrieval_chance": 0.25, "mi_upper_bound": 1.0, "num_rows": 4.0, "new_proxy": 2.0}
    assert table_rows(values) == [("retrieval_acc", 0.5, 0.25, 0.25, 1.0), ("new_proxy", 2.0, None, None, None)]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "no such file"),
        ("directory", "it is a directory"),
        ("empty_file", "the file has no non-blank lines"),
        ("all_bad", "all skipped: 1 not valid JSON (first at line 1); 1 missing field 'reasoning'"),
        ("one_prompt", "at least 2 distinct prompts"),
        ("same_prompt_two_groups", "hold 1 distinct prompt (2 groups)"),
        ("max_rows_zero", "--max-rows=0 is out of range; it must be >= 1"),
        ("small_budget", "--max-tokens-per-forward=10 must be 0 (auto) or >= 64"),
        ("negative_limit", "--max-tokens=-1 is out of range; it must be >= 0"),
        ("no_model_folder", "no such folder"),
        ("not_a_model_folder", "no config.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(case, message, model_dir, loaded, tmp_path, capsys):
    _, tokenizer = loaded
    records = good_records(tokenizer)
    model, extra = model_dir, []
    path = write_jsonl(tmp_path / "r.jsonl", records)
    if case == "missing":
        path = str(tmp_path / "absent.jsonl")
    elif case == "directory":
        path = str(tmp_path)
    elif case == "empty_file":
        path = write_jsonl(tmp_path / "r.jsonl", ["", "  "])
    elif case == "all_bad":
        path = write_jsonl(
            tmp_path / "r.jsonl", ["{oops", {"prompt": "p", "group": 1}, {**records[0], "reasoning": ""}]
        )
    elif case == "one_prompt":
        path = write_jsonl(tmp_path / "r.jsonl", records[:2])
    elif case == "same_prompt_two_groups":
        path = write_jsonl(tmp_path / "r.jsonl", [records[0], {**records[1], "group": "other"}])
    elif case == "max_rows_zero":
        extra = ["--max-rows", "0"]
    elif case == "small_budget":
        extra = ["--max-tokens-per-forward", "10"]
    elif case == "negative_limit":
        extra = ["--max-tokens", "-1"]
    elif case == "no_model_folder":
        model = str(tmp_path / "no_such_model")
    elif case == "not_a_model_folder":
        model = str(tmp_path)
    assert main(["diagnose", "--model", model, "--rollouts", path, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]


@pytest.mark.slow
def test_command_line_end_to_end(model_dir, loaded, tmp_path):
    """`python -m ragen_lit diagnose` as a user runs it: the table on a good file; one `error:` line, exit
    code 2 and no traceback for a missing file and for a file without usable rows (both found before
    any model is loaded, so those processes are cheap). The processes run at once."""
    _, tokenizer = loaded
    good = write_jsonl(tmp_path / "good.jsonl", good_records(tokenizer))
    all_bad = write_jsonl(tmp_path / "bad.jsonl", ["{oops", {"prompt": "p", "group": 1}])
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ragen_lit",
                "diagnose",
                "--model",
                model_dir,
                "--rollouts",
                path,
                "--device",
                "cpu",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for path in (good, str(tmp_path / "absent.jsonl"), all_bad)
    ]
    (good_out, good_err), *failed = [run.communicate(timeout=300) for run in runs]
    assert runs[0].returncode == 0, good_err
    assert "retrieval_acc" in good_out and "mi_est" in good_out and "Traceback" not in good_err
    for run, (out, err), message in zip(runs[1:], failed, ("no such file", "no usable rows")):
        assert run.returncode == 2 and out == ""
        assert err.strip().splitlines() == [err.strip()] and err.startswith("error: ") and message in err


def test_options_share_the_config_default_and_its_check(capsys):
    """`--max-tokens-per-forward` has `diagnostics.max_tokens_per_forward`'s default (0 = auto: 8192 on a CPU) and
    rule; the flags' choices come from the same dataclass."""
    assert DiagnoseOptions("m", "r.jsonl").max_tokens_per_forward == DiagnosticsConfig().max_tokens_per_forward == 0
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--model", "m", "--rollouts", "r.jsonl", "--dtype", "float16"])
    assert exit_info.value.code == 2 and "invalid choice: 'float16'" in capsys.readouterr().err


HUGE = 10_000_000  # characters: rows no context holds


def test_rows_longer_than_the_context_are_skipped_without_tokenizing_them(model_dir, loaded, tmp_path):
    """A 10 MB prompt and a 10 MB reasoning are skipped and counted on one line; neither is tokenized (the
    character bound: 256 positions x the longest vocabulary entry), and the other rows are scored as before."""
    model, tokenizer = loaded
    records = good_records(tokenizer)
    lines = records + [
        {**records[0], "prompt": records[0]["prompt"] + "x" * HUGE, "group": "huge prompt"},
        {**records[0], "reasoning": "go left " * (HUGE // 8)},
    ]
    rows, skipped, read = read_rollouts(write_jsonl(tmp_path / "r.jsonl", lines))
    encoded = []
    original = type(tokenizer).encode
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            type(tokenizer), "encode", lambda self, text, **kw: encoded.append(len(text)) or original(self, text, **kw)
        )
        result = diagnose_rollouts(model, tokenizer, rows, skipped, read)
    reason = "prompt + reasoning over the 256-token limit (the model's context)"
    assert dict(result.skipped.counts) == {reason: 2}
    assert result.skipped.describe() == [f"2: {reason} (lines 7, 8)"]
    assert max(encoded) < 10_000
    reference = diagnose_rollouts(model, tokenizer, *read_rollouts(write_jsonl(tmp_path / "g.jsonl", records)))
    assert result.values == reference.values and result.rows_used == 6


def test_max_tokens_and_the_longest_prompt_bound_every_pair(loaded, tmp_path):
    """--max-tokens lowers the limit; a row that fits on its own but not after the longest column prompt is
    skipped too, since its reasoning is scored under every prompt."""
    model, tokenizer = loaded
    records = good_records(tokenizer)

    def tokens(text):
        return len(tokenizer.encode(text, add_special_tokens=False))

    prompts = [tokens(r["prompt"]) for r in records]
    longest, shortest = max(prompts), min(prompts)
    short = records[prompts.index(shortest)]
    reasoning = " ".join(["left"] * (longest - shortest + 20))
    limit = shortest + tokens(reasoning)  # the new row fits alone, not after the longest prompt
    assert longest > shortest and all(p + tokens(r["reasoning"]) <= limit for p, r in zip(prompts, records))
    lines = records + [{**short, "reasoning": reasoning}]
    rows = read_rollouts(write_jsonl(tmp_path / "r.jsonl", lines))
    result = diagnose_rollouts(model, tokenizer, *rows, max_tokens=limit)
    reason = f"reasoning + the longest prompt ({longest} tokens) over the {limit}-token limit (--max-tokens)"
    assert dict(result.skipped.counts) == {reason: 1} and result.rows_used == 6
    # a limit above the model's context (256) does not raise it: the row fits there
    wide = diagnose_rollouts(
        model, tokenizer, *read_rollouts(write_jsonl(tmp_path / "w.jsonl", lines)), max_tokens=10**6
    )
    assert wide.skipped.total() == 0 and wide.rows_used == 7


@pytest.mark.slow
def test_huge_rows_end_quickly_in_bounded_memory(model_dir, loaded, tmp_path):
    """The command on a file with a 10 MB prompt row and a 10 MB reasoning row: exit 0, the report counts both
    as skipped on one line, in a short time and well below a gigabyte of extra memory (before: > 300 s at 11 GB,
    and an attempt to allocate 10.9 TB)."""
    import time

    _, tokenizer = loaded
    records = good_records(tokenizer)
    lines = records + [
        {**records[0], "prompt": "x" * HUGE},
        {**records[2], "reasoning": "y" * HUGE},
    ]
    path = write_jsonl(tmp_path / "r.jsonl", lines)
    started = time.perf_counter()
    # a fresh launcher whose only child is the command, so its peak resident memory is the command's own
    # (this test process's RUSAGE_CHILDREN would also count every earlier test's subprocesses)
    launcher = (
        "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
        "print('peak_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(done.returncode)"
    )
    command = ["-m", "ragen_lit", "diagnose", "--model", model_dir, "--rollouts", path, "--device", "cpu"]
    run = subprocess.run(
        [sys.executable, "-c", launcher, sys.executable, *command],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert time.perf_counter() - started < 120
    assert "skipped 2: prompt + reasoning over the 256-token limit (the model's context) (lines 7, 8)" in run.stdout
    peak_kib = int(run.stderr.rsplit("peak_kib", 1)[1].split()[0])
    assert peak_kib < 3 * 2**20  # under 3 GiB
