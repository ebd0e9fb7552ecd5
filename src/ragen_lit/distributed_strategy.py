"""Lightning strategies for several ranks.

RL updates here do several backward passes per optimizer step (micro-batches, actor then critic) and
the kept rollouts per rank differ after filtering, so DDP's one-forward-one-backward reducer does not
fit. `ManualSyncDDPStrategy` keeps everything Lightning's DDP strategy does (process group, devices,
seeding, checkpoint barriers) but leaves the module unwrapped; `AgentRLModule` sums gradients over
ranks itself right before each optimizer step, with every loss normalised by the *global* token or
sequence count of the mini-batch, so the update equals the single-process update on all ranks' rows.
"""
from __future__ import annotations

from datetime import timedelta

from lightning.pytorch.strategies import DDPStrategy


class ManualSyncDDPStrategy(DDPStrategy):
    strategy_name = "ragen_ddp"

    def configure_ddp(self) -> None:
        """No DistributedDataParallel wrapper: gradients are reduced by the module (see module docs)."""


def ddp_strategy(cfg) -> ManualSyncDDPStrategy:
    return ManualSyncDDPStrategy(timeout=timedelta(minutes=cfg.trainer.timeout_minutes))
