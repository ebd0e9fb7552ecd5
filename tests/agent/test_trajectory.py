"""Right padding of trajectories into [B, T] tensors, by hand."""

from __future__ import annotations

import torch

from ragen_lit.agent.trajectory import Trajectory, pad_trajectories, right_pad

T, F = True, False


def test_right_pad_fills_after_each_row_and_keeps_the_dtype():
    padded = right_pad([[1.5, -2.0], [], [0.25]], 9.0, torch.float32)
    assert padded.dtype == torch.float32
    assert padded.tolist() == [[1.5, -2.0], [9.0, 9.0], [0.25, 9.0]]
    assert right_pad([[T], [F, T, T]], F, torch.bool).tolist() == [[T, F, F], [F, T, T]]


def test_pad_trajectories_by_hand():
    a = Trajectory(group=0, seed=0)
    a.append([5, 6], sampled=False)
    a.append([7, 8], sampled=True, logprobs=[-0.5, -0.25])
    a.append([9], sampled=False)
    b = Trajectory(group=1, seed=1)
    b.append([5], sampled=False)
    b.append([12], sampled=True, logprobs=[-1.0])
    input_ids, attention_mask, loss_mask = pad_trajectories([a, b], pad_token_id=0)
    assert input_ids.dtype == torch.long and attention_mask.dtype == loss_mask.dtype == torch.bool
    assert input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 12, 0, 0, 0]]
    assert attention_mask.tolist() == [[T] * 5, [T, T, F, F, F]]
    assert loss_mask.tolist() == [[F, F, T, T, F], [F, T, F, F, F]]
