"""`parallel.lockstep` on one process: no padding unless sharded, and a dummy's loss has exactly zero gradient."""

from __future__ import annotations

import torch

from ragen_lit.parallel.lockstep import dummy_micro_batch, lockstep, zero_loss


def test_unsharded_lockstep_is_the_real_micro_batches_only():
    micro = {"input_ids": torch.zeros(1, 3, dtype=torch.long)}
    assert lockstep([micro], sharded=False, pad_token_id=0, device=torch.device("cpu")) == [(micro, True)]
    assert lockstep((), sharded=False, pad_token_id=0, device=torch.device("cpu")) == []
    # one process is its own busiest rank: sharded or not, nothing is missing
    assert lockstep([micro], sharded=True, pad_token_id=0, device=torch.device("cpu")) == [(micro, True)]


def test_dummy_micro_batch_is_one_row_of_two_pad_tokens_the_second_scored():
    dummy = dummy_micro_batch(7, torch.device("cpu"))
    assert dummy["input_ids"].tolist() == [[7, 7]] and dummy["attention_mask"].tolist() == [[True, True]]
    assert dummy["loss_mask"].tolist() == [[False, True]]
    prepared = ("old_logprobs", "ref_logprobs", "advantages", "values", "returns")
    assert all(dummy[k].tolist() == [[0.0, 0.0]] for k in prepared)


def test_zero_loss_gives_an_exactly_zero_gradient():
    weight = torch.tensor([1.5, -2.0], requires_grad=True)
    output = (weight * 3.0, None, weight.exp())  # a tuple like `LogProbs`, with a missing entry
    loss = zero_loss(output)
    loss.backward()
    assert loss.item() == 0.0 and weight.grad.tolist() == [0.0, 0.0]
