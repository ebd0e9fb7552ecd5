"""FSDP2 (`fully_shard`) for `trainer.strategy=fsdp`: sharding, summed gradients, the inference replica.

Used by `AgentRLModule.configure_model` when the strategy (`distributed_strategy.FSDPStrategy`) gives
the module a device mesh. The pieces:

- `shard_causal_lm` / `shard_module`: one FSDP unit per decoder layer (the classes the model lists in
  `_no_split_modules`), then a root unit for the rest (embeddings, final norm, head, value head).
  `token_logprobs` calls a causal LM's decoder and its head separately (chunked head) and never the
  model's own forward, so a causal LM's root unit is a `TokenScorer` around it whose forward *is*
  `token_logprobs`: FSDP's root hooks (all-gather of the embedding/norm/head shard before,
  reduce-scatter of their gradients after) then run around every scoring call.
- `sum_gradients_over_ranks`: FSDP2 averages gradients over ranks by default; the RL losses are
  normalised by global token/sequence counts and expect a *sum* (see `distributed_strategy`), so every
  unit gets divide factor 1 with sum-only reductions (gloo has no PREMUL_SUM/AVG; NCCL does either).
- `inference_replica` / `copy_full_weights`: rollouts and the MI cross-scorer run an unknown,
  rank-dependent number of forwards, which a sharded model (one collective per forward) cannot do;
  they run on a full per-rank copy of the policy, refreshed from the shards parameter by parameter.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ragen_lit.logprobs import token_logprobs
from ragen_lit.models import DTYPES, layer_units
from ragen_lit.parallel.collectives import full_tensor


class TokenScorer(nn.Module):
    """`token_logprobs(model, …)` as a module forward, so that it can be an FSDP root (see module docs).
    Holds `model` as a child without copying it; the model's parameter names stay its own."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        return token_logprobs(self.model, input_ids, attention_mask, **kwargs)


def mixed_precision(param_dtype: str | None, reduce_dtype: str | None):
    """`MixedPrecisionPolicy` from the config names (None: the parameters' own dtype), or None if neither is set."""
    if param_dtype is None and reduce_dtype is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=DTYPES[param_dtype] if param_dtype else None,
        reduce_dtype=DTYPES[reduce_dtype] if reduce_dtype else None,
    )


def shard_module(root: nn.Module, mesh, mp_policy=None, *, layers_of: nn.Module | None = None) -> nn.Module:
    """`fully_shard` every layer unit of `layers_of` (default `root`), then `root`; gradients summed."""
    from torch.distributed.fsdp import fully_shard

    kwargs = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for layer in layer_units(layers_of if layers_of is not None else root):
        fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)
    sum_gradients_over_ranks(root)
    return root


def shard_causal_lm(model: nn.Module, mesh, mp_policy=None) -> TokenScorer:
    """Shard a causal LM in place; returns its FSDP root, the `TokenScorer` to score tokens with."""
    return shard_module(TokenScorer(model), mesh, mp_policy, layers_of=model)


def sum_gradients_over_ranks(root: nn.Module) -> None:
    """Make every FSDP unit under `root` reduce-scatter gradients as a plain sum over ranks.

    `set_gradient_divide_factor(1.0)` (torch >= 2.8; `set_reduce_scatter_divide_factor` before) is per
    unit, hence the loop. With it alone FSDP2 reduces with NCCL's PREMUL_SUM(1.0), which gloo refuses;
    `set_force_sum_reduction_for_comms(True)` (when present) makes it a SUM followed by a division by 1
    (skipped), on every backend."""
    from torch.distributed.fsdp import FSDPModule

    for module in root.modules():
        if not isinstance(module, FSDPModule):
            continue
        setter = getattr(module, "set_gradient_divide_factor", None) or getattr(
            module, "set_reduce_scatter_divide_factor", None
        )
        if setter is None:
            raise RuntimeError(
                f"torch {torch.__version__}: FSDP2 has no gradient divide factor setter; "
                f"trainer.strategy=fsdp needs torch >= 2.6"
            )
        setter(1.0)
        force_sum = getattr(module, "set_force_sum_reduction_for_comms", None)
        if force_sum is not None:
            force_sum(True)


def inference_replica(policy: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A full, frozen, unsharded copy of `policy` (call before sharding it) for rollouts and diagnostics.
    `dtype` (default: the policy's own) casts the parameters only, as FSDP's `param_dtype` does: buffers
    such as rotary frequencies keep theirs, so the replica computes what the sharded forward computes."""
    replica = copy.deepcopy(policy).eval()
    for p in replica.parameters():
        p.requires_grad_(False)
        if dtype is not None:
            p.data = p.data.to(dtype)
    return replica


@torch.no_grad()
def copy_full_weights(sharded: nn.Module, replica: nn.Module) -> None:
    """Load the sharded model's current weights into `replica`, one gathered parameter at a time (peak
    extra memory: one full parameter). Collective: every rank calls it at the same point."""
    reshard(sharded)
    target = dict(replica.named_parameters())
    for name, param in sharded.named_parameters():
        full = full_tensor(param.detach())
        target[name].copy_(full)
        del full


def reshard(model: nn.Module) -> None:
    """Free the gathered parameters of every FSDP unit in `model`. A root unit keeps them gathered after
    a no-grad forward (FSDP2 does not reshard the root after forward); meanwhile `model.parameters()`
    yields those full tensors instead of the sharded parameters the optimizer and the gradients live on."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def global_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all `tensors` together; for sharded (`DTensor`) gradients the norm over all ranks'
    shards, i.e. of the full gradient (a collective)."""
    if not tensors:
        return torch.zeros(())
    return full_tensor(torch.nn.utils.get_total_norm(tensors, 2.0))
