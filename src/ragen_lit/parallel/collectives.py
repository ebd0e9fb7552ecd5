"""The few collectives the RL loop needs, each a no-op when torch.distributed is not initialised.

Free of Lightning, so that engines/ and metrics/ use these too instead of their own copies."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) when none runs more than one rank."""
    if is_distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def backend_device(group=None) -> torch.device:
    """The device `group`'s collectives (default: the default group's) take their tensors on: the current GPU under
    NCCL, the host otherwise (gloo, a CPU-and-GPU group, or no process group). Decided by the backend alone: a
    one-rank NCCL group (`trainer.devices=1` under FSDP) refuses host tensors too."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_via_backend_device(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's `tensor` (same shape on all ranks), on `tensor`'s device: the all-gather runs where the backend
    needs it (a GPU under NCCL), so that host-side metric states can sync (torchmetrics' `dist_sync_fn`, which
    torchmetrics calls whenever a process group exists, one rank or many)."""
    device = backend_device(group)
    parts = [torch.empty_like(tensor, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.to(device), group=group)
    return [part.to(tensor.device) for part in parts]


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 `DTensor` is all-gathered (a collective: every rank must call it, in the
    same order); any other tensor comes back as is."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) else tensor


def gather_lists(items: list) -> tuple[list, int]:
    """All ranks' `items` concatenated in rank order (rank 0's first), on every rank, and the offset of
    this rank's items in that list (the number of items held by lower ranks)."""
    if not is_distributed():
        return list(items), 0
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, list(items))
    return [x for p in parts for x in p], sum(len(p) for p in parts[: dist.get_rank()])


def max_over_ranks(value: int) -> int:
    if not is_distributed():
        return value
    t = torch.tensor([value], dtype=torch.long, device=backend_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _reduce(tensor: torch.Tensor, op) -> torch.Tensor:
    if not is_distributed():
        return tensor
    t = tensor.to(backend_device())
    dist.all_reduce(t, op=op)
    return t.to(tensor.device)


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise sum over ranks (returned on the tensor's own device)."""
    return _reduce(tensor, dist.ReduceOp.SUM)


def tensor_max_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over ranks, as a tensor (`max_over_ranks` waits for its int)."""
    return _reduce(tensor, dist.ReduceOp.MAX)


# `sum_gradients` reduces gradients in flat buckets of about this many bytes: one collective per bucket instead of
# one per parameter (Qwen2.5-0.5B has 290 parameters, each call a launch and a round of latency)
REDUCE_BUCKET_BYTES = 64 << 20


def reduction_buckets(grads: list[torch.Tensor], bucket_bytes: int = REDUCE_BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """`grads` cut, in order, into runs of one dtype and device of at most `bucket_bytes` each (a larger tensor is a
    run of its own)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for grad in grads:
        nbytes = grad.numel() * grad.element_size()
        last = buckets[-1] if buckets else None
        if last is None or (grad.dtype, grad.device) != (last[0].dtype, last[0].device) or size + nbytes > bucket_bytes:
            buckets.append([grad])
            size = nbytes
        else:
            last.append(grad)
            size += nbytes
    return buckets


def sum_gradients(model: torch.nn.Module, bucket_bytes: int = REDUCE_BUCKET_BYTES) -> None:
    """Sum every parameter's gradient over ranks (ranks without a gradient contribute zeros), so that
    losses normalised by global counts give the exact all-ranks gradient on every rank. One all-reduce per
    `reduction_buckets` bucket (its gradients flattened into one buffer and copied back)."""
    if not is_distributed():
        return
    grads = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    for bucket in reduction_buckets(grads, bucket_bytes):
        if len(bucket) == 1:
            dist.all_reduce(bucket[0])
            continue
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        for grad, part in zip(bucket, flat.split([g.numel() for g in bucket])):
            grad.copy_(part.view_as(grad))


def assert_same_on_all_ranks(tensor: torch.Tensor, what: str) -> None:
    """Fail loudly (instead of silently diverging replicas) if ranks disagree on `tensor`."""
    if not is_distributed():
        return
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, tensor.cpu().tolist())
    if any(p != parts[0] for p in parts):
        raise RuntimeError(f"ranks disagree on the {what}: {parts}")


def gather_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All ranks' group rewards `[G_local, K]` → `[G, K]` sorted by group id, identical on every rank,
    so the filter computes one global keep mask."""
    if not is_distributed():
        order = torch.argsort(group_ids, stable=True)
        return rewards[order], group_ids[order]
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (rewards.cpu(), group_ids.cpu()))
    all_rewards = torch.cat([p[0] for p in parts])
    all_ids = torch.cat([p[1] for p in parts])
    order = torch.argsort(all_ids, stable=True)
    return all_rewards[order], all_ids[order]


MAX_OVER_RANKS_PREFIX = "memory/"
"""metrics under this prefix (peak GPU memory per phase) combine as the largest rank's value, not the mean"""


def combine_rank_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """One dict from every rank's scalar metrics: each key's mean over the ranks that report it (key sets may
    differ: a rank that kept no rollouts has no update statistics), its maximum under `memory/`."""
    keys = sorted({k for p in parts for k in p})
    values = {k: [p[k] for p in parts if k in p] for k in keys}
    return {k: max(v) if k.startswith(MAX_OVER_RANKS_PREFIX) else sum(v) / len(v) for k, v in values.items()}


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Every rank's scalar metrics combined (`combine_rank_metrics`: means, peaks' maxima), on every rank."""
    if not is_distributed():
        return metrics
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, dict(metrics))
    return combine_rank_metrics(parts)
