"""`build_models`: the weights' dtype follows where the run computes. `model.dtype=auto` means bfloat16 on a GPU only;
a run told to use the CPU keeps float32 weights even on a machine with a GPU (sweeps run their CPU runs that way)."""

from __future__ import annotations

import pytest
import torch

from ragen_lit.config import load_config
from ragen_lit.training.build_models import build_models


@pytest.mark.parametrize(
    ("accelerator", "dtype", "expected"),
    [("cpu", "auto", torch.float32), ("auto", "auto", torch.bfloat16), ("cpu", "bfloat16", torch.bfloat16)],
)
def test_auto_weights_are_bfloat16_only_where_the_run_uses_a_gpu(
    monkeypatch, tiny_model_dir, accelerator, dtype, expected
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    cfg = load_config(None, [f"trainer.accelerator={accelerator}", f"model.dtype={dtype}", "algo=ppo"])
    policy, critic = build_models(cfg.model, cfg.trainer, cfg.algo.advantage, str(tiny_model_dir))
    assert {p.dtype for p in policy.parameters()} == {expected}
    assert {p.dtype for p in critic.parameters()} == {expected}
