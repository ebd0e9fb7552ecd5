"""`bench.update`: variant parsing, the synthetic batch, and a --smoke run (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.update import parse_variant, synthetic_batch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_update.py"


def test_variants_parse_config_keys_and_the_attention_backend():
    assert parse_variant("c16:model.compile=true,optim.micro_batch_size=16,sdpa=flash") == (
        "c16",
        ["model.compile=true", "optim.micro_batch_size=16"],
        "flash",
    )
    assert parse_variant("plain:") == ("plain", [], None)
    for bad, message in (
        ("sdpa=flash", "expected name:"),
        ("x:sdpa", "is not key=value"),
        (":a=1", "may not be empty"),
        ("x:sdpa=fast", "allowed: flash"),
    ):
        with pytest.raises(SystemExit, match=message):
            parse_variant(bad)


def test_synthetic_batch_has_the_turn_structure():
    batch = synthetic_batch(rows=6, length=200, turns=4, response=10, vocab=50, seed=0)
    lengths = batch["attention_mask"].sum(-1)
    assert ((lengths >= 190) & (lengths <= 210)).all()
    assert batch["attention_mask"].shape[1] == int(lengths.max())
    assert (batch["loss_mask"].sum(-1) == 40).all()  # 4 turns x 10 sampled tokens
    assert (batch["turn_end_mask"].sum(-1) == 4).all()
    assert not (batch["loss_mask"] & ~batch["attention_mask"]).any()
    for row in range(6):  # the reward sits on the last sampled token
        last = int(batch["loss_mask"][row].nonzero().max())
        assert batch["token_rewards"][row, last] == batch["scores"][row]
        assert batch["token_rewards"][row].count_nonzero() == 1


def test_synthetic_batch_lengths_follow_the_spread():
    lengths = synthetic_batch(rows=64, length=200, turns=4, response=10, vocab=50, seed=0, spread=0.5)[
        "attention_mask"
    ].sum(-1)
    assert ((lengths >= 100) & (lengths <= 300)).all() and lengths.max() - lengths.min() > 150


@pytest.mark.slow
def test_smoke_run_times_each_variant_and_reports_a_bad_one(tmp_path):
    out = tmp_path / "update.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            "--repeats",
            "2",
            "--profile",
            "--fresh-shapes",
            "--out",
            str(out),
            "--variant",
            "mb2:optim.micro_batch_size=2",
            "--variant",
            "lora:model.lora.r=4",
            "--variant",
            "grpo:algo=grpo,optim.num_minibatches=1",
            "--variant",
            "bad:optim.micro_batch_size=-1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 1, done.stderr[-3000:]  # the bad variant fails, the report still prints
    assert "| mb2 | optim.micro_batch_size=2 | 2 |" in done.stdout
    assert "| bad | failed: " in done.stdout and "optim.micro_batch_size" in done.stdout
    assert "every pass its own batch (--fresh-shapes)" in done.stdout
    res = json.loads(out.read_text())
    good = res["results"][0]
    assert good["micro_batch_size"] == 2 and good["update_s"] > 0 and good["tokens_per_s"] > 0
    assert good["profile"]["wall_s"] > 0
    tokens = good["tokens_per_pass"]  # --fresh-shapes: each timed pass trains on its own batch
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    lora = res["results"][1]  # the adapters (and the critic's value head) train, a few percent of the weights
    assert lora["update_s"] > 0 and 0 < lora["trainable_params"] < good["trainable_params"] / 10
    grpo = res["results"][2]  # no critic: the actor's weights alone train
    assert grpo["update_s"] > 0 and not grpo["critic"] and good["critic"]
    assert grpo["trainable_params"] < good["trainable_params"]
