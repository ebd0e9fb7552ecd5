"""`python -m ragen_lit fit ARGS`, with probes, for the multi-rank tests of `test_fit_e2e.py`.

`RAGEN_LIT_PROBE_DIR=OUT python tests/parallel/fsdp_fit_probe.py fit --config ... overrides` runs the normal
CLI (Lightning relaunches this same script for the other ranks); every rank writes OUT/rank{r}.pt holding, at
train start (after any checkpoint restore) and at train end, its inference policy's weights and its
actor optimizer's step count, plus per iteration the filter statistics (computed from all ranks'
rewards) and how many rows it kept itself, and its own rows' rewards, and for every iteration whose MI
diagnostics ran: its own trajectories, the inference policy's weights they were scored with, and the values.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ragen_lit import cli
from ragen_lit.parallel.collectives import full_tensor
from ragen_lit.training.data import RolloutDataModule
from ragen_lit.training.module import AgentRLModule

OUT = Path(os.environ["RAGEN_LIT_PROBE_DIR"])
RECORD: dict = {"filter": [], "diagnostics": []}


def _snapshot(module) -> dict:
    weights = {k: v.detach().cpu().clone() for k, v in module.inference_policy().state_dict().items()}
    optimizer = module.trainer.optimizers[0]
    steps = [float(full_tensor(s["step"])) for s in optimizer.state_dict()["state"].values() if "step" in s]
    return {"weights": weights, "optimizer_step": max(steps, default=0.0)}


def on_train_start(self):
    RECORD["start"] = _snapshot(self)


def on_train_end(self):
    RECORD["end"] = _snapshot(self)
    rank = dist.get_rank() if dist.is_initialized() else 0
    OUT.mkdir(parents=True, exist_ok=True)
    torch.save(RECORD, OUT / f"rank{rank}.pt")


_select = RolloutDataModule.select


def select(self, trajectories):
    keep_rows, stats = _select(self, trajectories)
    RECORD["filter"].append(
        {
            "stats": stats,
            "kept_rows": len(keep_rows),
            "rows": len(trajectories),
            "rewards": [t.reward for t in trajectories],
        }
    )
    return keep_rows, stats


_collapse_diagnostics = AgentRLModule.collapse_diagnostics


def collapse_diagnostics(self, trajectories, iteration):
    values = _collapse_diagnostics(self, trajectories, iteration)
    if values:
        weights = {k: v.detach().cpu().clone() for k, v in self.inference_policy().state_dict().items()}
        RECORD["diagnostics"].append(
            {"iteration": iteration, "trajectories": list(trajectories), "weights": weights, "values": values}
        )
    return values


AgentRLModule.on_train_start = on_train_start
AgentRLModule.collapse_diagnostics = collapse_diagnostics
AgentRLModule.on_train_end = on_train_end
RolloutDataModule.select = select

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
