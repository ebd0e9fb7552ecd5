"""SFT on rollout trajectories: batch layout and loss weights by hand, the sampled-token loss against
the model's own loss, length-grouped batching as a partition, and a loss that goes down."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen3Config, Qwen3ForCausalLM

from ragen_lit.agent.trajectory import Trajectory
from ragen_lit.presets.sft import length_grouped_batches, sft_batch, sft_loss, supervised_finetune

PAD = 0


def trajectory(prompt, response, close=(), next_prompt=(), next_response=()):
    t = Trajectory(group=0, seed=0)
    for ids, sampled in (
        (prompt, False),
        (response, True),
        (close, False),
        (next_prompt, False),
        (next_response, True),
    ):
        t.append(list(ids), sampled=sampled)
    return t


def tiny_lm(vocab=16, seed=0):
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config)


def test_batch_layout_by_hand():
    a = trajectory([5, 6], [7, 8], [9], [10], [11])
    b = trajectory([5], [12])
    batch = sft_batch([a, b], PAD)
    T, F = True, False
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11], [5, 12, 0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[T] * 7, [T, T] + [F] * 5]
    assert batch.sampled.tolist() == [[F, F, T, T, F, F, T], [F, T] + [F] * 5]


def test_loss_on_sampled_tokens_equals_the_models_own_loss():
    model = tiny_lm()
    batch = sft_batch([trajectory([1, 2, 3], [4, 5], [6], [7], [8, 9]), trajectory([1, 3], [2])], PAD)
    labels = torch.where(batch.sampled, batch.input_ids, -100)
    reference = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    torch.testing.assert_close(sft_loss(model, batch), reference)


def test_context_weight_weights_the_context_tokens():
    model = tiny_lm()
    batch = sft_batch([trajectory([1, 2], [3], [4, 5], [6], [7]), trajectory([1], [2])], PAD)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    nll = -torch.log_softmax(logits, dim=-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    # Row 0: targets 2..7; sampled targets 3 and 7, context targets 2, 4, 5, 6. Row 1: sampled 2, pads unscored.
    sampled = nll[0, 1] + nll[0, 5] + nll[1, 0]
    context = nll[0, 0] + nll[0, 2] + nll[0, 3] + nll[0, 4]
    expected = (sampled + 0.25 * context) / (3 + 0.25 * 4)
    torch.testing.assert_close(sft_loss(model, batch, context_weight=0.25), expected)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=60), st.integers(1, 9), st.integers(0, 10**6))
def test_length_grouped_batches_partition_the_indices(lengths, batch_size, seed):
    batches = length_grouped_batches(lengths, batch_size, random.Random(seed))
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(1 <= len(batch) <= batch_size for batch in batches)


def test_finetuning_lowers_the_loss_and_is_deterministic():
    data = [trajectory([1, 2, 3], [4, 5, 6]), trajectory([1, 3, 2], [6, 5, 4]), trajectory([2, 2], [7, 8])]
    runs = []
    for _ in range(2):
        model = tiny_lm()
        losses = supervised_finetune(
            model, data, steps=20, batch_size=2, learning_rate=2e-2, pad_token_id=PAD, seed=3, context_weight=0.5
        )
        runs.append(losses)
    assert runs[0] == runs[1]
    assert sum(runs[0][-5:]) / 5 < 0.5 * sum(runs[0][:5]) / 5
    assert not model.training


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="steps"):
        supervised_finetune(
            tiny_lm(), [trajectory([1], [2])], steps=0, batch_size=1, learning_rate=1e-3, pad_token_id=PAD, seed=0
        )
    with pytest.raises(ValueError, match="trajectory"):
        supervised_finetune(tiny_lm(), [], steps=1, batch_size=1, learning_rate=1e-3, pad_token_id=PAD, seed=0)
    with pytest.raises(ValueError, match="context_weight"):
        supervised_finetune(
            tiny_lm(),
            [trajectory([1], [2])],
            steps=1,
            batch_size=1,
            learning_rate=1e-3,
            pad_token_id=PAD,
            seed=0,
            context_weight=-1,
        )
