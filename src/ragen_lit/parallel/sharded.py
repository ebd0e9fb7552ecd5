"""The training module's models under `trainer.strategy=fsdp`: sharded in place, plus a full inference replica.

`ShardedModels` shards the policy, the frozen reference and the critic with FSDP2 (`ragen_lit.parallel.fsdp`;
the reference is sharded too: its forwards run in lock-step like the policy's, and a full copy per rank would
cost the memory FSDP saves). A causal LM's FSDP root is the `TokenScorer` around it (`scorer`). Rollouts and
the MI cross-scorer run an unknown, rank-dependent number of forwards, which a sharded model (one collective
per forward) cannot do: they run on `inference_policy`, a full per-rank copy of the policy made before
sharding and refreshed from the shards whenever the policy has stepped since.
"""

from __future__ import annotations

import torch
from torch import nn

from ragen_lit.parallel import fsdp


class ShardedModels:
    """FSDP2 state of one training module (not an `nn.Module`: kept out of its submodules and checkpoints)."""

    def __init__(
        self,
        policy: nn.Module,
        reference: nn.Module | None,
        critic: nn.Module | None,
        mesh,
        param_dtype: str | None = None,
        reduce_dtype: str | None = None,
    ):
        mp_policy = fsdp.mixed_precision(param_dtype, reduce_dtype)
        self.replica = fsdp.inference_replica(policy, fsdp.DTYPES[param_dtype] if param_dtype else None)
        self.policy, self.critic = policy, critic
        self._scorers = {id(policy): fsdp.shard_causal_lm(policy, mesh, mp_policy)}
        if reference is not None:
            self._scorers[id(reference)] = fsdp.shard_causal_lm(reference, mesh, mp_policy)
        if critic is not None:
            fsdp.shard_module(critic, mesh, mp_policy)
        self._replica_version = -1  # the policy version the replica holds

    def scorer(self, model: nn.Module) -> nn.Module | None:
        """The sharded root that scores tokens with `model` (policy or reference), None for any other model."""
        return self._scorers.get(id(model))

    def inference_policy(self, device: torch.device, policy_version: int) -> nn.Module:
        """The replica, on `device`, holding the policy's weights of `policy_version` (a collective when it
        must be refreshed: all ranks call this at the same points and take the same optimizer steps)."""
        if next(self.replica.parameters()).device != device:  # made before the strategy moved the module
            self.replica.to(device)
        if self._replica_version != policy_version:
            fsdp.copy_full_weights(self.policy, self.replica)
            self._replica_version = policy_version
        return self.replica

    def reshard(self) -> None:
        """Free the parameters a no-grad forward left gathered (see `fsdp.reshard`)."""
        for root in self._scorers.values():
            fsdp.reshard(root)
        if self.critic is not None:
            fsdp.reshard(self.critic)
