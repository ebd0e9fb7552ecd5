"""What `AgentRLModule.on_fit_start` sets for the process before the first rollout: `model.sdpa_cudnn=false` turns
cuDNN's attention kernels off for sdpa; the default leaves PyTorch's choice alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragen_lit.config import load_config
from ragen_lit.training.module import AgentRLModule

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cudnn_sdp_restored():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize("setting, enabled", [("true", True), ("false", False)])
def test_sdpa_cudnn_setting_reaches_the_process(tiny_model_dir, cudnn_sdp_restored, setting, enabled):
    torch.backends.cuda.enable_cudnn_sdp(True)
    overrides = [f"model.path={tiny_model_dir}", f"model.sdpa_cudnn={setting}"]
    cfg = load_config(ROOT / "conf" / "frozenlake.yaml", overrides)
    AgentRLModule(cfg).on_fit_start()
    assert torch.backends.cuda.cudnn_sdp_enabled() is enabled
