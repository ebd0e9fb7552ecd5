"""`trainer.checkpoint_every` counts iterations: an iteration whose filter keeps nothing (no optimizer step) still
writes its periodic checkpoint and last.ckpt when its turn comes, so that a resume loses at most
`checkpoint_every` iterations whatever the filter did."""

from __future__ import annotations

import torch
from mlflow.tracking import MlflowClient
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.cli import main
from ragen_lit.training import data


def test_an_iteration_whose_filter_keeps_nothing_is_checkpointed_in_its_turn(tmp_path, monkeypatch):
    """Iterations 2 and 3 of 4 keep nothing (the filter's keep mask emptied there), so no optimizer step happens
    between the checkpoints of iterations 1, 2 and 3: with checkpoint_every=1 every iteration is checkpointed all the
    same, and last.ckpt is iteration 4's."""
    real, calls = data.select_groups, []

    def keep_nothing_at_iterations_2_and_3(rewards, **options):
        calls.append(None)
        keep = real(rewards, **options)
        return torch.zeros_like(keep) if len(calls) in (2, 3) else keep

    monkeypatch.setattr(data, "select_groups", keep_nothing_at_iterations_2_and_3)
    out = tmp_path / "runs"
    args = [*SMALL, "filter.strategy=none", "trainer.iterations=4", "trainer.checkpoint_every=1"]
    assert main(["fit", "--config", CONFIG, *args, f"logging.output_dir={out}"]) == 0
    (run,) = out.glob("frozenlake-*")
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
    (row,) = client.search_runs([client.get_experiment_by_name("ragen_lit").experiment_id])
    empty = {m.step: m.value for m in client.get_metric_history(row.info.run_id, "filter/empty")}
    assert empty == {1: 0.0, 2: 1.0, 3: 1.0, 4: 0.0}  # the condition this test is about did happen
    checkpoints = run / "checkpoints"
    periodic = [(f"iter-{i:04d}.ckpt", i) for i in (1, 2, 3, 4)]
    assert sorted(p.name for p in checkpoints.iterdir()) == [name for name, _ in periodic] + ["last.ckpt"]
    for name, iteration in [*periodic, ("last.ckpt", 4)]:
        assert torch.load(checkpoints / name, weights_only=False)["epoch"] + 1 == iteration, name
