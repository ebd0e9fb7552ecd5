"""`models.Critic`: values aligned with the log-probs, the same with or without padding."""

from __future__ import annotations

import pytest
import torch
import transformers

from ragen_lit.models import Critic


@pytest.mark.parametrize("left", [False, True])
def test_values_of_padded_rows_equal_values_of_each_row_alone(left):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    critic = Critic(transformers.Qwen2Model(config), config.hidden_size).eval()
    torch.nn.init.normal_(critic.value_head.weight)
    lengths, width = [7, 3, 5], 7
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        mask[row, width - n :] = True if left else mask[row, width - n :]
        mask[row, :n] = True if not left else mask[row, :n]
    input_ids = torch.randint(1, 100, mask.shape, generator=torch.Generator().manual_seed(1)).masked_fill(~mask, 0)
    with torch.no_grad():
        values = critic(input_ids, mask)
        for row, n in enumerate(lengths):
            alone = critic(input_ids[row : row + 1, mask[row]], torch.ones(1, n, dtype=torch.bool))[0]
            torch.testing.assert_close(values[row][mask[row]], alone, atol=1e-5, rtol=0)
    assert values[:, 0].abs().sum() == 0
    if not left:  # every position after a padding position is 0
        assert values[1, 4:].abs().sum() == 0 and values[1, 3] != 0


def test_the_backbone_runs_without_a_kv_cache():
    """A cache would cost a copy of every layer's keys and values, and `model.compile` runs cached
    calls eagerly: the critic's update would then never use the compiled layers."""
    config = transformers.Qwen2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    assert config.use_cache  # the default a loaded backbone comes with
    critic = Critic(transformers.Qwen2Model(config), config.hidden_size)
    caches = []
    for layer in critic.backbone.layers:
        layer.register_forward_pre_hook(
            lambda module, args, kwargs: caches.append(kwargs.get("past_key_values", kwargs.get("cache"))),
            with_kwargs=True,
        )
    critic(torch.tensor([[1, 2, 3, 4]]), torch.ones(1, 4, dtype=torch.bool)).sum().backward()
    assert len(caches) == 2 and all(cache is None for cache in caches)


@pytest.mark.parametrize("left", [False, True])
def test_packed_rows_give_the_values_and_gradients_of_the_padded_batch(left):
    """`packed=True` (`optim.padding_free`): the rows end to end in one backbone forward, fp32-exact."""
    config = transformers.Qwen2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    lengths, width = [7, 3, 5, 1], 7
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        if left:
            mask[row, width - n :] = True
        else:
            mask[row, :n] = True
    input_ids = torch.randint(1, 100, mask.shape, generator=torch.Generator().manual_seed(1)).masked_fill(~mask, 0)
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2))

    def values_and_grads(packed: bool):
        torch.manual_seed(0)
        critic = Critic(transformers.Qwen2Model(config), config.hidden_size)
        torch.nn.init.normal_(critic.value_head.weight)
        values = critic(input_ids, mask, packed=packed)
        (values * weights).sum().backward()
        return values, {name: p.grad for name, p in critic.named_parameters()}

    (got, got_grads), (want, want_grads) = values_and_grads(True), values_and_grads(False)
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-5, rtol=1e-4, msg=name)
