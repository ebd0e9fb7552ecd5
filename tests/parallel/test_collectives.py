"""Collectives shared by the trainer, the engines and the diagnostics: alone, and over two gloo processes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ragen_lit.parallel import collectives
from ragen_lit.parallel.collectives import (
    backend_device,
    combine_rank_metrics,
    full_tensor,
    gather_lists,
    rank_and_world,
    reduction_buckets,
    sum_gradients,
    tensor_max_over_ranks,
)


def test_without_process_group_everything_is_local():
    items = [[1, 2], [3]]
    gathered, offset = gather_lists(items)
    assert gathered == items and gathered is not items
    assert offset == 0
    assert rank_and_world() == (0, 1)
    tensor = torch.ones(2)
    assert full_tensor(tensor) is tensor


def test_collectives_take_tensors_where_the_backend_runs_them_whatever_the_world_size(monkeypatch):
    """NCCL takes GPU tensors even in a one-rank group (`trainer.devices=1 trainer.strategy=fsdp`, where torchmetrics
    still syncs its states through `gather_via_backend_device`); gloo and mixed groups take host tensors."""
    assert backend_device() == torch.device("cpu")  # no process group
    monkeypatch.setattr(collectives.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(collectives.dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(collectives.torch.cuda, "current_device", lambda: 3)
    for backend, device in (("nccl", torch.device("cuda", 3)), ("gloo", torch.device("cpu"))):
        monkeypatch.setattr(collectives.dist, "get_backend", lambda group=None, backend=backend: backend)
        assert backend_device() == device, backend
    monkeypatch.setattr(collectives.dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert backend_device() == torch.device("cpu")


def test_rank_metrics_average_over_the_ranks_that_report_them_and_peaks_take_the_largest():
    parts = [
        {"loss": 1.0, "time/update_s": 2.0, "memory/update_peak_gib": 30.0},
        {"loss": 3.0, "time/update_s": 4.0, "memory/update_peak_gib": 50.0, "memory/prepare_peak_gib": 5.0},
        {"time/update_s": 6.0, "memory/update_peak_gib": 40.0},  # kept nothing: no loss
    ]
    assert combine_rank_metrics(parts) == {
        "loss": 2.0,  # (1 + 3) / 2: the rank without it is not a zero
        "time/update_s": 4.0,
        "memory/update_peak_gib": 50.0,  # the rank closest to running out
        "memory/prepare_peak_gib": 5.0,
    }


def test_reduction_buckets_cut_in_order_by_size_and_dtype():
    a, b, c = torch.zeros(4), torch.zeros(4), torch.zeros(4)  # 16 bytes each
    big, half, half2 = torch.zeros(20), torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.bfloat16)
    buckets = reduction_buckets([a, b, c, big, half, half2], bucket_bytes=32)
    assert [[id(t) for t in bucket] for bucket in buckets] == [
        [id(a), id(b)],  # 32 bytes: full
        [id(c)],  # c and big would exceed 32
        [id(big)],  # 80 bytes: a bucket of its own
        [id(half), id(half2)],  # another dtype starts a bucket
    ]
    assert reduction_buckets([]) == []


def _gradient_model(rank: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    model[2].requires_grad_(False)  # frozen: left alone
    for i, p in enumerate(model[:2].parameters()):
        if rank == 1 and i == 3:
            continue  # no gradient on this rank: it contributes zeros
        p.grad = torch.full_like(p, float(10 * rank + i))
    return model


def worker(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        assert rank_and_world() == (rank, 2)
        # Uneven split: rank 0 holds two items, rank 1 one, so rank 1's items start at 2.
        local = [[1, 2], [3]] if rank == 0 else [[4, 5, 6]]
        assert gather_lists(local) == ([[1, 2], [3], [4, 5, 6]], 0 if rank == 0 else 2)
        # A rank with nothing still takes part and gets everyone else's items.
        assert gather_lists(["a"] if rank == 0 else []) == (["a"], 0 if rank == 0 else 1)
        assert tensor_max_over_ranks(torch.tensor([3 - rank, rank])).tolist() == [3, 1]
        # gradients summed over ranks, in buckets of at most 48 bytes (several per model) and in one
        for bucket_bytes in (48, 1 << 20):
            model = _gradient_model(rank)
            sum_gradients(model, bucket_bytes=bucket_bytes)
            for i, p in enumerate(model[:2].parameters()):
                want = i if i == 3 else i + (10 + i)  # rank 0 holds i, rank 1 10 + i (none for parameter 3)
                torch.testing.assert_close(p.grad, torch.full_like(p, float(want)))
            assert all(p.grad is None for p in model[2].parameters())
        # no rank tears the group down while the other still talks to it (gloo aborts)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gather_lists_over_two_ranks(free_port):
    mp.spawn(worker, args=(free_port,), nprocs=2, join=True)
