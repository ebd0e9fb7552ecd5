"""Bad configurations end `fit` with exit code 2 and one `error:` line naming the key, before any model loads and
before anything is written (issue 17, items 3 and 4: the output folder and the MLflow store are checked too)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from ragen_lit.cli import main

CONF = str(Path(__file__).resolve().parents[1] / "conf" / "frozenlake.yaml")


def _unwritable(out: Path, make_unwritable) -> Path:
    out.mkdir()
    make_unwritable(out)
    return out


def _under_a_file(out: Path, make_unwritable) -> Path:
    out.write_text("a file where the output folder's parent should be")
    return out / "runs"


def _corrupt_store(out: Path, make_unwritable) -> Path:
    out.mkdir()
    (out / "mlruns.db").write_bytes(b"not an sqlite database " * 64)
    return out


def _store_is_a_folder(out: Path, make_unwritable) -> Path:
    (out / "mlruns.db").mkdir(parents=True)
    return out


# (YAML text or None for conf/frozenlake.yaml, overrides, what the line must name with {out} the output folder
# [, a layout that prepares `out` and returns the logging.output_dir to pass])
CASES = {
    "malformed yaml": ("trainer:\n  seed: [1,\n", [], "not valid YAML"),
    "duplicate yaml key": ("trainer:\n  seed: 1\n  seed: 2\n", [], "duplicate key seed"),
    "unknown yaml section": ("trainer:\n  seed: 1\nbogus:\n  x: 1\n", [], "'bogus'; sections are: model, env"),
    "yaml section as a scalar": ("trainer: 5\n", [], "section trainer is 5"),
    "precision": (None, ["trainer.precision=bogus"], "trainer.precision='bogus'"),
    "gpu memory share": (None, ["trainer.gpu_memory_fraction=1.5"], "trainer.gpu_memory_fraction=1.5 is out of range"),
    "gpu without cuda": (None, ["trainer.accelerator=gpu"], "trainer.accelerator=gpu"),
    "tracking uri scheme": (None, ["logging.tracking_uri=bogus://x"], "logging.tracking_uri='bogus://x'"),
    "empty experiment": (None, ["logging.experiment="], "logging.experiment=''"),
    "missing critic folder": (None, ["model.critic_path=/no/such/folder"], "model.critic_path='/no/such/folder'"),
    "vllm not installed": (None, ["rollout.engine=vllm"], "rollout.engine=vllm needs the vllm extra"),
    "context too short": (None, ["rollout.max_context_tokens=16"], "rollout.max_context_tokens=16"),
    "trajectory share zero": (None, ["filter.level=trajectory", "filter.value=0"], "filter.value=0.0"),
    "lora rank negative": (None, ["model.lora.r=-1"], "model.lora.r=-1 is out of range; it must be >= 0"),
    "lora dropout one": (None, ["model.lora.dropout=1"], "model.lora.dropout=1"),
    "lora unknown key": (None, ["model.lora.rank=8"], "model.lora.rank: unknown key; keys of model.lora are: r, alpha"),
    "lora under fsdp": (None, ["model.lora.r=8", "trainer.strategy=fsdp"], "model.lora.r=8 with trainer.strategy=fsdp"),
    "output folder unwritable": (None, [], "cannot write in {out} (Permission denied)", _unwritable),
    "output folder under a file": (None, [], "{out} is a file, not a folder", _under_a_file),
    "corrupt mlflow store": (None, [], "store {out}/mlruns.db is not a readable sqlite database", _corrupt_store),
    "mlflow store is a folder": (None, [], "store {out}/mlruns.db is a folder, not an sqlite file", _store_is_a_folder),
}


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_stops_with_one_line_and_writes_nothing(case, tmp_path, monkeypatch, capsys, make_unwritable):
    if case == "gpu without cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if case == "vllm not installed" and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    text, overrides, names, *layout = CASES[case]
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # an MLflow store or mlruns/ folder made in the current folder would show here
    config = CONF
    if text is not None:
        config = str(tmp_path / "bad.yaml")
        Path(config).write_text(text)
    output_dir = layout[0](out, make_unwritable) if layout else out
    before = _tree(tmp_path)
    started = time.perf_counter()
    code = main(["fit", "--config", config, f"logging.output_dir={output_dir}", *overrides])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and names.format(out=out) in lines[0], err
    assert "Traceback" not in err
    assert _tree(tmp_path) == before
    assert time.perf_counter() - started < 30  # a broken store fails at once, not after MLflow's retries


@pytest.mark.parametrize("command", ["fit", "warm-start", "config", "sweep", "compare", "diagnose", "export"])
def test_every_command_prints_its_help(command, capsys):
    """`--help` of each subcommand prints and exits 0 (a `%` in a help text once broke warm-start's)."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert "usage: " in capsys.readouterr().out
