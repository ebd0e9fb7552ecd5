"""The (X, Z) pairs the collapse diagnostics score: Z as the policy sampled it."""

from __future__ import annotations

from ragen_lit.agent.trajectory import Trajectory, Turn
from ragen_lit.config import load_config
from ragen_lit.metrics.collapse import CollapseDiagnostics, first_turn_pairs, sampled_reasoning


def _trajectory(group: int, reasoning_end: int | None) -> Trajectory:
    # prompt 10+g 20+g, then the sampled reasoning tokens 7 8 9, then </think> etc. (ids 50 51)
    t = Trajectory(group=group, seed=group, token_ids=[10 + group, 20 + group, 7, 8, 9, 50, 51])
    t.turns.append(Turn(2, 7, "a b", ["Up"], 0.0, True, reasoning_end=reasoning_end))
    return t


def test_the_reasoning_scored_is_its_sampled_tokens_else_its_text():
    sampled, unsplit = _trajectory(0, reasoning_end=5), _trajectory(1, reasoning_end=None)
    assert sampled_reasoning(sampled, sampled.turns[0]) == [7, 8, 9]
    assert sampled_reasoning(unsplit, unsplit.turns[0]) == "a b"  # re-encoded by the scorer


def test_diagnostics_inputs_carry_the_sampled_ids():
    import random

    from ragen_lit.metrics.collapse import Candidate

    cfg = load_config(None, ["diagnostics.every_n_iterations=1"])
    trajectories = [_trajectory(0, 5), _trajectory(1, None), _trajectory(2, 5)]
    pairs = first_turn_pairs([Candidate.of(t) for t in trajectories], 8, random.Random(0))
    ((prompts, mine),) = CollapseDiagnostics(cfg.diagnostics)._inputs(None, [pairs], dict(enumerate(trajectories)))
    assert prompts == [[10, 20], [11, 21], [12, 22]]
    assert sorted(mine, key=lambda row: row[1]) == [([7, 8, 9], 0), ("a b", 1), ([7, 8, 9], 2)]
