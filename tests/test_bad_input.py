"""Bad configurations end `fit` with exit code 2 and one `error:` line naming the key, before any model loads and
before anything is written (issue 17, item 3)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ragen_lit.cli import main

CONF = str(Path(__file__).resolve().parents[1] / "conf" / "frozenlake.yaml")

# (YAML text or None for conf/frozenlake.yaml, overrides, what the line must name)
CASES = {
    "malformed yaml": ("trainer:\n  seed: [1,\n", [], "not valid YAML"),
    "duplicate yaml key": ("trainer:\n  seed: 1\n  seed: 2\n", [], "duplicate key seed"),
    "unknown yaml section": ("trainer:\n  seed: 1\nbogus:\n  x: 1\n", [], "'bogus'; sections are: model, env"),
    "yaml section as a scalar": ("trainer: 5\n", [], "section trainer is 5"),
    "precision": (None, ["trainer.precision=bogus"], "trainer.precision='bogus'"),
    "gpu without cuda": (None, ["trainer.accelerator=gpu"], "trainer.accelerator=gpu"),
    "tracking uri scheme": (None, ["logging.tracking_uri=bogus://x"], "logging.tracking_uri='bogus://x'"),
    "empty experiment": (None, ["logging.experiment="], "logging.experiment=''"),
    "missing critic folder": (None, ["model.critic_path=/no/such/folder"], "model.critic_path='/no/such/folder'"),
    "vllm not installed": (None, ["rollout.engine=vllm"], "rollout.engine=vllm needs the vllm extra"),
    "context too short": (None, ["rollout.max_context_tokens=16"], "rollout.max_context_tokens=16"),
    "trajectory share zero": (None, ["filter.level=trajectory", "filter.value=0"], "filter.value=0.0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_stops_with_one_line_and_writes_nothing(case, tmp_path, monkeypatch, capsys):
    if case == "gpu without cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if case == "vllm not installed" and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    text, overrides, names = CASES[case]
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # an MLflow store or mlruns/ folder made in the current folder would show here
    config = CONF
    if text is not None:
        config = str(tmp_path / "bad.yaml")
        Path(config).write_text(text)
    code = main(["fit", "--config", config, f"logging.output_dir={out}", *overrides])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], err
    assert "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())
    assert not any(cwd.iterdir())
