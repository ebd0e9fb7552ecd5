"""`bench.scoring`: the FLOP count of a cross-scoring call by hand, and the benchmark end to end on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.scoring import scoring_flops, workload

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_scoring.py"


def test_scoring_flops_by_hand():
    # d 4, 2 layers, 2 heads of 2 (one KV head), MLP 8, vocabulary 10:
    # per layer q 16 + k,v 2*4*2=16 + o 16 + MLP 3*4*8=96 = 144; body N = 288
    shape = {"hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1}
    config = SimpleNamespace(**shape, intermediate_size=8, vocab_size=10)
    prompts = [[1, 2, 3]]  # prefix p = 2
    reasonings = [[5], [6, 7]]  # rows of w = 2 and 3
    prefix = 2 * 288 * 2 + 2 * 2 * 4 * 2 * 2  # 1152 + 64

    def row(w: int) -> int:
        return 2 * 288 * w + 2 * 10 * 4 * w + 4 * 2 * 4 * w * 2 + 2 * 2 * 4 * w * w

    assert scoring_flops(config, prompts, reasonings) == prefix + row(2) + row(3)


def test_fresh_draws_change_the_prompt_lengths_within_their_range():
    args = SimpleNamespace(prompts=16, reasonings=4, prompt_min=20, prompt_max=90, reasoning_tokens=10)
    spread, first, second = (workload(args, 100, draw) for draw in (0, 1, 2))
    lengths = [[len(p) for p in prompts] for prompts, _ in (spread, first, second)]
    assert lengths[0] == sorted(lengths[0]) and (lengths[0][0], lengths[0][-1]) == (20, 90)  # evenly spread
    assert lengths[1] != lengths[2] and all(20 <= n <= 90 for n in lengths[1] + lengths[2])
    assert workload(args, 100, 1)[0] == first[0]  # a draw is reproducible


@pytest.mark.slow
def test_bench_scoring_runs_on_cpu_and_writes_its_table(tmp_path):
    out = tmp_path / "scoring.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--prompts", "4", "--reasonings", "3", "--prompt-min", "20"]
        + ["--prompt-max", "60", "--reasoning-tokens", "10", "--tokens-per-forward", "128", "0", "--repeats", "1"]
        + [
            "--modes",
            "eager",
            "compiled",
            "--pad-widths",
            "off",
            "--attention",
            "auto",
            "efficient",
            "varlen",
            "--fresh-shapes",
            "--profile",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(out.read_text())
    settings = [(r["tokens_per_forward"], r["mode"], r["pad_widths"], r["attention"]) for r in res["results"]]
    # 0: 8192 on a CPU
    # packed rows (varlen) have no widths to round
    assert settings == [
        (b, m, "off" if a != "varlen" else "n/a", a)
        for b in (128, 8192)
        for m in ("eager", "compiled")
        for a in ("auto", "efficient", "varlen")
    ]
    assert all(r["seconds"] > 0 and r["pairs_per_s"] > 0 for r in res["results"])
    assert res["workload"]["flops"] > 0 and 20 <= res["workload"]["prompt_tokens_mean"] <= 60
    assert "| tokens per forward | model | padded widths | attention | seconds |" in done.stdout
    assert "every call a fresh draw of prompt lengths" in done.stdout
    # --profile's section (no CUDA kernels on a CPU)
    assert "one call at 8192 tokens per forward, compiled model, padded widths n/a, attention varlen" in done.stdout


@pytest.mark.slow
def test_bench_scoring_refuses_a_bad_workload():
    command = [sys.executable, str(SCRIPT), "--prompts", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1])
    assert done.returncode == 2 and "--prompts >= 2" in done.stderr
