"""`plan_minibatches` (filter.minibatch): hand-computed plans. `scale` keeps the optimizer step count and shrinks the
mini-batches with the keep rate; `fixed` keeps the unfiltered mini-batch size and takes fewer steps. Every epoch
visits each kept row exactly once."""

from __future__ import annotations

import pytest
import torch

from ragen_lit.training.data import plan_minibatches


def _plan(kept, total, num_minibatches, mode, epochs, seed=0):
    return plan_minibatches(kept, total, num_minibatches, mode, epochs, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "kept, total, num_minibatches, mode, epochs, sizes",
    [
        # scale: ceil(kept / num_minibatches) rows per mini-batch
        (16, 16, 4, "scale", 1, [4, 4, 4, 4]),  # nothing filtered: the unfiltered plan
        (8, 16, 4, "scale", 1, [2, 2, 2, 2]),  # half kept: same 4 steps, half-size mini-batches
        (8, 16, 4, "scale", 2, [2] * 8),  # ppo_epochs=2: two passes of 4 steps
        (10, 16, 4, "scale", 1, [3, 3, 3, 1]),  # ceil(10/4) = 3, the last one holds the rest
        # fixed: ceil(total / num_minibatches) rows per mini-batch, fewer steps when rows are dropped
        (16, 16, 4, "fixed", 1, [4, 4, 4, 4]),
        (8, 16, 4, "fixed", 1, [4, 4]),  # half kept: half the steps
        (10, 16, 4, "fixed", 2, [4, 4, 2, 4, 4, 2]),
        (3, 16, 2, "fixed", 1, [3]),  # fewer kept rows than one unfiltered mini-batch: a single step
    ],
)
def test_plan_has_the_hand_computed_minibatch_sizes(kept, total, num_minibatches, mode, epochs, sizes):
    plan = _plan(kept, total, num_minibatches, mode, epochs)
    assert [len(mb) for mb in plan] == sizes
    per_epoch = len(plan) // epochs
    for e in range(epochs):  # each epoch is one permutation of the kept rows
        rows = [i for mb in plan[e * per_epoch : (e + 1) * per_epoch] for i in mb]
        assert sorted(rows) == list(range(kept))


def test_plan_is_shuffled_by_the_generator_and_reproducible():
    assert _plan(16, 16, 4, "scale", 2, seed=3) == _plan(16, 16, 4, "scale", 2, seed=3)
    first, second = _plan(16, 16, 1, "scale", 2, seed=3)
    assert first != list(range(16)) and first != second  # shuffled, and freshly per epoch


def test_nothing_kept_gives_no_minibatch_and_an_unknown_mode_is_refused():
    assert _plan(0, 16, 4, "scale", 1) == [] and _plan(0, 16, 4, "fixed", 3) == []
    with pytest.raises(ValueError, match="filter.minibatch"):
        _plan(8, 16, 4, "sometimes", 1)
