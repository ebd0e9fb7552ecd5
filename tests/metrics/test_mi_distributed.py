"""Two processes (gloo, or NCCL on 2 GPUs: `tests/parallel/ranks.py`): rows split over ranks give the single-process
result; prompts are all-gathered."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.parallel.ranks import close, init_rank, require_ranks

from ragen_lit.metrics import MIDiagnostics, MIRecallAtK, MIRetrievalAcc, MIZScore, MIZScoreEMA, gather_prompts

WORLD_SIZE = 2


def scoring_round(seed: int, rows: int, columns: int):
    generator = torch.Generator().manual_seed(seed)
    tok = torch.randn(rows, columns, generator=generator) - 3
    seq = tok * torch.randint(5, 40, (rows, 1), generator=generator)
    target = torch.randint(0, columns, (rows,), generator=generator)
    groups = torch.tensor([0, 1, 1, 2, 3, 3, 4, 5])[:columns]
    return tok, seq, target, groups


def new_metrics(device: torch.device, **kwargs) -> dict:
    metrics = {
        "diagnostics": MIDiagnostics(**kwargs),
        "acc": MIRetrievalAcc(**kwargs),
        "recall@4": MIRecallAtK(4, **kwargs),
        "zscore": MIZScore(**kwargs),
        "zscore_ema": MIZScoreEMA(**kwargs),
    }
    return {name: metric.to(device) for name, metric in metrics.items()}


def feed(metrics: dict, tok, seq, target, groups) -> None:
    device = next(iter(metrics.values())).device
    tok, seq, target, groups = (t.to(device) for t in (tok, seq, target, groups))
    for name, metric in metrics.items():
        if name == "diagnostics":
            metric.update(tok, seq, target, groups)
        else:
            metric.update(seq if name == "zscore_ema" else tok, target, groups)


def as_floats(metrics: dict) -> dict[str, float]:
    values = {}
    for name, metric in metrics.items():
        result = metric.compute()
        if isinstance(result, dict):
            values.update({f"{name}/{key}": float(value) for key, value in result.items()})
        else:
            values[name] = float(result)
    return values


def assert_equal_values(got: dict[str, float], want: dict[str, float], rank: int) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert close(got[name], want[name]), (rank, name, got[name], want[name])


def worker(rank: int, port: int) -> None:
    device = init_rank(rank, WORLD_SIZE, port)
    try:
        local_prompts = [[1, 2], [3]] if rank == 0 else [[4, 5, 6]]
        assert gather_prompts(local_prompts) == [[1, 2], [3], [4, 5, 6]]

        synced, single = new_metrics(device), new_metrics(device, sync_on_compute=False)
        # Round 1: uneven split, rank 0 in two updates.
        tok, seq, target, groups = scoring_round(seed=0, rows=21, columns=8)
        feed(single, tok, seq, target, groups)
        parts = [slice(0, 4), slice(4, 9)] if rank == 0 else [slice(9, 21)]
        for part in parts:
            feed(synced, tok[part], seq[part], target[part], groups)
        assert_equal_values(as_floats(synced), as_floats(single), rank)

        # Round 2 after reset: rank 1 holds no rows; the EMA folds the global std on both ranks.
        for metrics in (synced, single):
            for metric in metrics.values():
                metric.reset()
        tok, seq, target, groups = scoring_round(seed=1, rows=13, columns=6)
        feed(single, tok, seq, target, groups)
        part = slice(0, 13) if rank == 0 else slice(0, 0)
        feed(synced, tok[part], seq[part], target[part], groups)
        assert_equal_values(as_floats(synced), as_floats(single), rank)

        emas = torch.stack([synced["zscore_ema"].ema_marginal_std, synced["diagnostics"].ema_marginal_std_seq])
        gathered = [torch.zeros_like(emas) for _ in range(WORLD_SIZE)]
        dist.all_gather(gathered, emas)
        assert torch.equal(gathered[0], gathered[1])
        # no rank tears the group down while the other still talks to it (gloo aborts)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_split_over_two_ranks_equals_one_process(free_port):
    require_ranks(WORLD_SIZE)
    mp.spawn(worker, args=(free_port,), nprocs=WORLD_SIZE, join=True)


def test_gather_prompts_without_process_group_returns_input():
    prompts = [[1, 2], [3]]
    assert gather_prompts(prompts) is prompts
