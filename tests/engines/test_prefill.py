"""`engines.prefill`: left padding (by hand, round trips, the vocabulary check) and the shared-prefix plan (by hand,
and against every cut of a brute force)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.engines.prefill import left_pad, shared_prefix_plan


def test_left_pad_puts_prompts_right_aligned_with_mask():
    input_ids, attention_mask = left_pad([[4, 5, 6], [7]], 0, torch.device("cpu"))
    assert input_ids.tolist() == [[4, 5, 6], [0, 0, 7]]
    assert attention_mask.tolist() == [[True, True, True], [False, False, True]]


@given(st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=6), min_size=1, max_size=6))
def test_left_pad_round_trips(prompts):
    input_ids, attention_mask = left_pad(prompts, 0, torch.device("cpu"))
    assert [row[mask].tolist() for row, mask in zip(input_ids, attention_mask)] == prompts
    assert attention_mask[:, -1].all()


def test_left_pad_checks_the_ids_against_the_vocabulary():
    cpu = torch.device("cpu")
    assert left_pad([[0, 4], [4]], 0, cpu, vocab_size=5)[0].tolist() == [[0, 4], [0, 4]]
    for bad in ([[5]], [[1, 2], [-1]]):
        with pytest.raises(ValueError, match=r"\[0, 5\)"):
            left_pad(bad, 0, cpu, vocab_size=5)


def test_shared_prefix_plan_by_hand():
    plan = shared_prefix_plan([[1, 2, 3, 4], [9, 9], [1, 2, 3, 5]])
    assert plan.prefixes == [[9], [1, 2, 3]]  # built from the end of the sorted order
    assert plan.prefix_of == [1, 0, 1]
    assert plan.suffixes == [[4], [9], [5]]
    # identical prompts keep their last token as suffix; 2 prefixes x 3 + 3 rows x 1 positions
    identical = shared_prefix_plan([[1, 2, 3, 4]] * 3)
    assert (identical.prefixes, identical.suffixes) == ([[1, 2, 3]], [[4]] * 3)
    assert plan.padded_tokens() == 2 * 3 + 3 * 1


def test_shared_prefix_plan_prefers_the_longer_prefix_of_each_group():
    # two groups of 3 share [1, 1] across groups but 6 tokens within: two runs save 2 x 2 x 6 = 24 > 5 x 2
    group_a = [[1, 1, 2, 2, 2, 2, t] for t in (10, 11, 12)]
    group_b = [[1, 1, 3, 3, 3, 3, t] for t in (10, 11, 12)]
    plan = shared_prefix_plan(group_a + group_b)
    assert sorted(plan.prefixes) == [[1, 1, 2, 2, 2, 2], [1, 1, 3, 3, 3, 3]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=8))
def test_shared_prefix_plan_splits_every_prompt_into_its_prefix_and_a_suffix(prompts):
    plan = shared_prefix_plan(prompts)
    for b, prompt in enumerate(prompts):
        assert plan.prefixes[plan.prefix_of[b]] + plan.suffixes[b] == prompt
        assert len(plan.suffixes[b]) >= 1
    saved = sum(map(len, prompts)) - sum(map(len, plan.prefixes)) - sum(map(len, plan.suffixes))
    assert saved >= 0


def most_saved(prompts) -> int:
    """Prefix tokens saved by the best cut of the sorted prompts into runs, every cut tried: a run of m prompts
    saves (m - 1) x the tokens they all share, each keeping its last token."""
    ordered = sorted(prompts)

    def shared(run):
        n = min(len(p) - 1 for p in run)
        return next((k for k in range(n) if len({p[k] for p in run}) > 1), n)

    best = 0
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        starts = [0] + [k + 1 for k, cut in enumerate(cuts) if cut] + [len(ordered)]
        runs = [ordered[a:b] for a, b in itertools.pairwise(starts)]
        best = max(best, sum((len(run) - 1) * shared(run) for run in runs))
    return best


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=1, max_size=7))
def test_shared_prefix_plan_saves_the_most_tokens_any_cut_saves(prompts):
    """The dynamic program, which stops growing a run once its prompts share no token, finds the best cut."""
    plan = shared_prefix_plan(prompts)
    saved = sum(len(plan.prefixes[k]) for k in plan.prefix_of) - sum(map(len, plan.prefixes))
    assert saved == most_saved(prompts)


# later turns of two groups: each group's rows start with the group's first prompt, then differ
