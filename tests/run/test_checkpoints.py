"""Which checkpoint stands for a run folder (`run.checkpoints`) and which run `trainer.resume=last` continues: the
newest complete checkpoint, whichever kind, with the names written before the `=`-free ones still read."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ragen_lit.config import load_config
from ragen_lit.errors import ConfigError
from ragen_lit.run.checkpoints import complete_checkpoints, newest_checkpoint
from ragen_lit.run.folder import default_run_name, resolve_run_dir

NAME = "frozenlake-grpo-top_p0.9"


def _resolve(cfg):
    """`resolve_run_dir` of the run `cfg` describes, as `fit` opens it."""
    return resolve_run_dir(cfg.logging, cfg.trainer, default_run_name(cfg))


def _write(path: Path, seconds: int) -> Path:
    """A checkpoint file (or, for a folder, its meta.pt) written `seconds` after a fixed moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path / "meta.pt" if path.is_dir() else path
    target.write_bytes(b"x")
    os.utime(target, ns=(10**18 + seconds * 10**9,) * 2)
    return path


def test_the_newest_complete_checkpoint_stands_for_the_run(tmp_path):
    run = tmp_path / "run"
    assert newest_checkpoint(run) is None
    folder = run / "checkpoints"
    _write(folder / "iter-epoch=0001.ckpt", 1)  # a name written before the `=`-free ones
    last = _write(folder / "last.ckpt", 2)
    assert newest_checkpoint(run) == last
    periodic = _write(folder / "iter-0004.ckpt", 3)  # stopped before its last.ckpt
    _write(folder / ".last.ckpt.partial", 4)  # and while writing it: a partial file never counts
    (folder / "last-v1.ckpt").mkdir()  # a sharded folder without its meta.pt is not complete
    assert newest_checkpoint(run) == periodic
    assert [p.name for p in complete_checkpoints(run)] == ["iter-epoch=0001.ckpt", "last.ckpt", "iter-0004.ckpt"]
    _write(folder / "last.ckpt", 3)  # written at the same moment as the periodic one: last.ckpt comes after it
    assert newest_checkpoint(run) == last


def test_resume_last_takes_the_newest_checkpoint_of_the_runs_of_that_name(tmp_path):
    older = _write(tmp_path / f"{NAME}-20260101-120000" / "checkpoints" / "last.ckpt", 1)
    cfg = load_config(None, ["algo=grpo", f"logging.output_dir={tmp_path}", "trainer.resume=last"])
    assert _resolve(cfg)[1] == str(older)
    newer = _write(tmp_path / f"{NAME}-20260101-130000" / "checkpoints" / "iter-0002.ckpt", 2)
    assert _resolve(cfg)[:2] == (newer.parent.parent, str(newer))
    # another run whose name starts with this one's is not a run of this name
    _write(tmp_path / f"{NAME}-b-20260101-140000" / "checkpoints" / "last.ckpt", 3)
    assert _resolve(cfg)[1] == str(newer)
    named = load_config(None, ["logging.run_name=x", f"logging.output_dir={tmp_path}", "trainer.resume=last"])
    start = "start afresh with the same command without trainer.resume$"
    with pytest.raises(ConfigError, match=f"^trainer.resume=last: no run named 'x' under {tmp_path}; {start}"):
        _resolve(named)
    (tmp_path / "x-20260101-120000").mkdir()  # a run of that name that never reached its first checkpoint
    (tmp_path / "x-20260101-130000" / "checkpoints").mkdir(parents=True)
    newest = re.escape(str(tmp_path / "x-20260101-130000"))
    with pytest.raises(ConfigError, match=f"^trainer.resume=last: no checkpoint in {newest} .*; {start}"):
        _resolve(named)


def test_the_checkpoint_callback_names_its_files_without_and_keeps_the_key_of_its_state(tmp_path):
    """Periodic files are named by their 1-based iteration; the callback's state keeps `ModelCheckpoint`'s key, so a
    run checkpointed with the older names resumes with its state (else its next last.ckpt would be last-v1.ckpt)."""
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ragen_lit.run.checkpoint_writer import IterationCheckpoint

    callback = IterationCheckpoint(tmp_path, every_n_iterations=5)
    assert Path(callback.format_checkpoint_name({"epoch": torch.tensor(4), "step": torch.tensor(9)})).name == (
        "iter-0005.ckpt"
    )
    assert Path(callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)).name == "last.ckpt"
    older = ModelCheckpoint(dirpath=tmp_path, filename="iter-{epoch:04d}", every_n_epochs=5, save_last=True)
    assert callback.state_key == older.state_key
