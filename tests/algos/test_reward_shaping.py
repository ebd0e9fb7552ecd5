"""DAPO's soft overlong punishment R_length on hand-computed lengths."""

import pytest
import torch

from ragen_lit.algos import overlong_penalty


def test_overlong_penalty_hand_computed():
    # L_max = 100, L_cache = 20: 0 up to 80 tokens, then (80 - |y|) / 20 down to -1 at 100, -1 beyond
    lengths = torch.tensor([0, 50, 80, 81, 90, 95, 99, 100, 101, 500])
    expected = torch.tensor([0.0, 0.0, 0.0, -0.05, -0.5, -0.75, -0.95, -1.0, -1.0, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, 100, 20), expected)


def test_overlong_penalty_edge_buffers():
    lengths = torch.tensor([3.0, 4.0, 5.0])
    # L_cache = 0: the hard cut (nothing up to L_max, -1 beyond)
    torch.testing.assert_close(overlong_penalty(lengths, 4, 0), torch.tensor([0.0, 0.0, -1.0]))
    # L_cache = L_max: the penalty grows from the first token, -|y| / L_max
    torch.testing.assert_close(overlong_penalty(lengths, 4, 4), torch.tensor([-0.75, -1.0, -1.0]))


@pytest.mark.parametrize("cache", [-1, 101])
def test_overlong_penalty_refuses_a_cache_outside_the_budget(cache):
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(torch.tensor([1]), 100, cache)
