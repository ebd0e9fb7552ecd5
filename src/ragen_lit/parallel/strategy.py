"""Lightning strategies for several ranks.

RL updates here do several backward passes per optimizer step (micro-batches, actor then critic) and
the kept rollouts per rank differ after filtering, so DDP's one-forward-one-backward reducer does not
fit. `ManualSyncDDPStrategy` keeps everything Lightning's DDP strategy does (process group, devices,
seeding, checkpoint barriers) but leaves the module unwrapped; `AgentRLModule` sums gradients over
ranks itself right before each optimizer step, with every loss normalised by the *global* token or
sequence count of the mini-batch, so the update equals the single-process update on all ranks' rows.

`FSDPStrategy` (`trainer.strategy=fsdp`) is Lightning's `ModelParallelStrategy` with a one-dimensional
data-parallel mesh over all ranks (no tensor parallelism). `AgentRLModule.configure_model` shards the
policy, the critic and the frozen reference with FSDP2 on that mesh (`ragen_lit.parallel.fsdp`): the
reduce-scatter sums gradients (divide factor 1), so the same globally normalised losses give the same
update as DDP. Every sharded forward/backward is a collective; the module pads every rank's
micro-batch count to the maximum over ranks (`ragen_lit.parallel.lockstep`). Checkpoints
are distributed-checkpoint folders (`last.ckpt/` holding one shard file per rank plus `meta.pt`).
"""

from __future__ import annotations

from datetime import timedelta

from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

from ragen_lit.config import TrainerConfig


class ManualSyncDDPStrategy(DDPStrategy):
    strategy_name = "ragen_ddp"

    def configure_ddp(self) -> None:
        """No DistributedDataParallel wrapper: gradients are reduced by the module (see module docs)."""


class FSDPStrategy(ModelParallelStrategy):
    """`ModelParallelStrategy` whose device mesh is (world size, 1): FSDP over every rank of every node."""

    strategy_name = "ragen_fsdp"

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()


def ddp_strategy(trainer: TrainerConfig) -> ManualSyncDDPStrategy:
    return ManualSyncDDPStrategy(timeout=timedelta(minutes=trainer.timeout_minutes))


def fsdp_strategy(trainer: TrainerConfig) -> FSDPStrategy:
    return FSDPStrategy(timeout=timedelta(minutes=trainer.timeout_minutes), save_distributed_checkpoint=True)


def _device_count(trainer: TrainerConfig) -> int:
    """Processes per node Lightning will start for `trainer.devices` (an int, a list of ids, or 'auto')."""
    devices = trainer.devices
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if devices == "auto":
        import torch

        # Lightning's 'auto' takes every visible GPU when it runs on GPUs, one process on CPU
        if trainer.accelerator != "cpu" and torch.cuda.is_available():
            return torch.cuda.device_count()
        return 1
    return int(devices)


def choose_strategy(trainer: TrainerConfig):
    """fsdp and ddp are the project's own strategies; `auto` takes the project's DDP as soon as there is more than
    one process (Lightning's auto pick wraps the module in DistributedDataParallel, whose reducer does not fit the
    RL update's several backward passes: its collectives mismatch and the ranks abort)."""
    if trainer.strategy == "fsdp":
        return fsdp_strategy(trainer)
    if trainer.strategy == "ddp" or _device_count(trainer) * trainer.num_nodes > 1:
        return ddp_strategy(trainer)
    return "auto"
