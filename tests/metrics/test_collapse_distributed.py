"""`CollapseDiagnostics.maybe_compute` on 2 gloo ranks, each holding half of one iteration's rollouts, gives the
single process's values on all of them: the (X, Z) pairs are drawn once over all ranks' trajectories, so N, the
chance levels and every MI metric match (with per-rank draws N and the chance level grew with the world size).

Groups are dealt round-robin as `train_seeds` deals them (rank 0: groups 0 and 2, rank 1: groups 1 and 3), so
this also checks that the draw follows the single process's order, not the ranks'. `num_samples` is below the
number of candidates in both scopes, so the draw really samples. With `RAGEN_LIT_TEST_DEVICE=cuda` the ranks are NCCL
processes on 2 GPUs, the metrics' host-side states syncing through them (`tests/parallel/ranks.py`).
"""

from __future__ import annotations

import pytest
import torch
from tests.parallel.ranks import close, init_rank, reference_device, require_ranks

from ragen_lit.agent.trajectory import Trajectory, Turn
from ragen_lit.config import load_config

GROUPS, GROUP_SIZE = 4, 2
RANK_GROUPS = ([0, 2], [1, 3])


def _trajectories() -> list[Trajectory]:
    """GROUPS x GROUP_SIZE trajectories in group order; a group shares its first prompt, later turns differ;
    a few turns have no reasoning (broken format), one trajectory has none at all."""
    words = ["left", "right", "up", "down", "wait", "push", "box", "goal"]
    trajectories = []
    for g in range(GROUPS):
        for k in range(GROUP_SIZE):
            t = Trajectory(group=g, seed=g, token_ids=[10 + g, 20 + g, 30 + g])
            for turn in range(3):
                t.token_ids += [40 + 7 * g + 3 * k + turn, 90 + turn]
                if (g, k) == (3, 1):
                    reasoning = None
                elif turn == 2 and k == 0:
                    reasoning = ""
                else:
                    reasoning = f"I go {words[(g + k + turn) % 8]} then {words[(3 * g + turn) % 8]}"
                end = len(t.token_ids)
                t.turns.append(Turn(end, end, reasoning, [], 0.0, reasoning is not None))
            trajectories.append(t)
    return trajectories


def _compute(model_dir: str, trajectories: list[Trajectory], device: torch.device) -> dict[str, float]:
    from ragen_lit.agent.chat import ChatFormat
    from ragen_lit.metrics.collapse import CollapseDiagnostics
    from ragen_lit.models import load_policy, load_tokenizer

    cfg = load_config(
        None, [f"model.path={model_dir}", "diagnostics.num_samples=5", "diagnostics.every_n_iterations=1"]
    )
    torch.manual_seed(0)
    policy = load_policy(model_dir, "float32").to(device)
    chat = ChatFormat(load_tokenizer(model_dir))
    return CollapseDiagnostics(cfg.diagnostics).maybe_compute(policy, chat, trajectories, iteration=3)


def _worker(rank: int, world: int, port: int, model_dir: str, expected: dict[str, float]) -> None:
    import torch.distributed as dist

    device = init_rank(rank, world, port)
    try:
        mine = [t for t in _trajectories() if t.group in RANK_GROUPS[rank]]
        got = _compute(model_dir, mine, device)
        assert got.keys() == expected.keys(), (rank, sorted(got.keys() ^ expected.keys()))
        # N and the chance levels first: they tell a per-rank draw at once
        for key, value in sorted(expected.items(), key=lambda item: ("num_" not in item[0], "chance" not in item[0])):
            if key.startswith("time/"):
                continue  # a clock: each process's own
            assert close(got[key], value), (rank, key, got[key], value)
        # no rank tears the group down while the other still talks to it (gloo aborts)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_give_the_single_process_diagnostics(tiny_model_dir, free_port):
    import torch.multiprocessing as mp

    require_ranks(2)
    expected = _compute(str(tiny_model_dir), _trajectories(), reference_device())
    # both scopes sample 5 pairs (of 7 valid first turns, 17 valid turns) and report N and chance levels
    for scope in ("first_turn", "trajectory"):
        assert expected[f"collapse/{scope}/num_rows"] == 5, expected
    assert any("chance" in key for key in expected), sorted(expected)
    mp.spawn(_worker, args=(2, free_port, str(tiny_model_dir), expected), nprocs=2, join=True)
