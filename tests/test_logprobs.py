"""token_logprobs against a naive full-logits computation on tiny random Qwen2 / Llama models."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ragen_lit.logprobs import (
    HostMasks,
    LogProbs,
    decoder_inputs,
    default_position_ids,
    mean_abs_logprob_diff,
    on_device,
    pack_rows,
    scored_positions,
    token_logprobs,
)

# the KV-cache keyword and the decoder call; CI also runs these at the lowest declared versions
pytestmark = pytest.mark.floors

VOCAB = 300
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tiny_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**TINY))
    else:
        model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=True))
    return model.float().eval()


def padded_batch(lengths: list[int], total: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids with the given real lengths, padded (pad id 0) on the right or the left."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, VOCAB, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.bool)
    for row, length in enumerate(lengths):
        if left:
            mask[row, total - length :] = True
        else:
            mask[row, :length] = True
    return input_ids.masked_fill(~mask, 0), mask


def naive_logprobs(model, input_ids, mask, temperature=1.0) -> LogProbs:
    """Full-vocabulary fp32 logits of the whole batch through the model's own forward."""
    logits = (
        model(input_ids=input_ids, attention_mask=mask.long(), position_ids=default_position_ids(mask)).logits.float()
        / temperature
    )
    log_probs = logits[:, :-1].log_softmax(-1)
    target = log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    scored = mask[:, 1:] & mask[:, :-1]
    pad = torch.zeros(input_ids.shape[0], 1)
    return LogProbs(torch.cat([pad, target * scored], dim=1), torch.cat([pad, entropy * scored], dim=1))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("chunk", [1, 4096])
def test_matches_naive_without_grad(kind, left, chunk):
    model = tiny_model(kind)
    input_ids, mask = padded_batch([9, 4, 12, 1], total=12, left=left)
    with torch.no_grad():
        got = token_logprobs(model, input_ids, mask, with_entropy=True, max_tokens_per_chunk=chunk, temperature=0.7)
        want = naive_logprobs(model, input_ids, mask, temperature=0.7)
    assert got.logprobs.dtype == torch.float32 and got.logprobs.shape == (4, 12)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy, want.entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("left", [False, True])
def test_gradients_match_naive(kind, left):
    input_ids, mask = padded_batch([10, 6, 3], total=10, left=left)
    weights = torch.randn(3, 10, generator=torch.Generator().manual_seed(2))

    def grads(compute) -> dict[str, torch.Tensor]:
        model = tiny_model(kind)
        out = compute(model)
        loss = (out.logprobs * weights).sum() + 0.3 * (out.entropy * weights.flip(1)).sum()
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    got = grads(lambda m: token_logprobs(m, input_ids, mask, with_entropy=True, max_tokens_per_chunk=5))
    want = grads(lambda m: naive_logprobs(m, input_ids, mask))
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)


def test_padding_and_first_position_are_zero():
    model = tiny_model("qwen2")
    for left in (False, True):
        input_ids, mask = padded_batch([5, 2], total=6, left=left)
        with torch.no_grad():
            out = token_logprobs(model, input_ids, mask, with_entropy=True)
        scored = torch.zeros_like(mask)
        scored[:, 1:] = mask[:, 1:] & mask[:, :-1]
        assert scored.sum() == 4 + 1
        assert (out.logprobs[~scored] == 0).all() and (out.entropy[~scored] == 0).all()
        assert (out.logprobs[scored] < 0).all() and (out.entropy[scored] > 0).all()


def test_left_and_right_padding_agree():
    model = tiny_model("llama")
    right_ids, right_mask = padded_batch([7, 3], total=7, left=False)
    left_ids = torch.zeros_like(right_ids)
    left_mask = torch.zeros_like(right_mask)
    for row, length in enumerate([7, 3]):
        left_ids[row, 7 - length :] = right_ids[row, :length]
        left_mask[row, 7 - length :] = True
    with torch.no_grad():
        right = token_logprobs(model, right_ids, right_mask).logprobs
        left = token_logprobs(model, left_ids, left_mask).logprobs
    torch.testing.assert_close(left[1, 4:], right[1, :3], atol=1e-5, rtol=0)
    torch.testing.assert_close(left[0], right[0], atol=1e-5, rtol=0)


def test_score_mask_scores_only_selected_positions():
    model = tiny_model("qwen2")
    input_ids, mask = padded_batch([8, 5], total=8, left=False)
    score_mask = torch.zeros_like(mask)
    score_mask[0, 5:] = True
    score_mask[1, 0:3] = True  # includes position 0, which can never be scored
    with torch.no_grad():
        full = token_logprobs(model, input_ids, mask).logprobs
        part = token_logprobs(model, input_ids, mask, score_mask=score_mask).logprobs
    expected = torch.where(score_mask, full, torch.zeros_like(full))
    torch.testing.assert_close(part, expected, atol=1e-6, rtol=0)
    assert (part[1, 1:3] != 0).all() and part[1, 0] == 0


def test_head_sees_at_most_max_tokens_per_chunk_positions():
    model = tiny_model("qwen2")
    seen = []
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    input_ids, mask = padded_batch([12, 12, 10], total=12, left=False)
    with torch.no_grad():
        token_logprobs(model, input_ids, mask, max_tokens_per_chunk=10)
    assert [shape[0] for shape in seen] == [10, 10, 10, 1]  # 11 + 11 + 9 scored positions
    assert all(shape[-1] == VOCAB for shape in seen)


def test_autograd_keeps_no_vocabulary_sized_tensor():
    """Under grad each chunk is checkpointed: nothing of width V is saved for backward."""
    model = tiny_model("qwen2").train()
    input_ids, mask = padded_batch([12, 10], total=12, left=False)
    saved_widths = []

    def pack(tensor):
        saved_widths.append(tensor.shape[-1] if tensor.dim() else 0)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = token_logprobs(model, input_ids, mask, with_entropy=True, max_tokens_per_chunk=8)
    assert saved_widths and VOCAB not in saved_widths
    (out.logprobs.sum() + out.entropy.sum()).backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


def test_frozen_model_under_grad_mode_needs_no_graph():
    model = tiny_model("qwen2").requires_grad_(False)
    input_ids, mask = padded_batch([6], total=6, left=False)
    out = token_logprobs(model, input_ids, mask)
    assert not out.logprobs.requires_grad and out.entropy is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(max_tokens_per_chunk=0), "max_tokens_per_chunk"),
        (dict(score_mask=torch.ones(2, 3, dtype=torch.bool)), "score_mask"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    model = tiny_model("qwen2")
    input_ids, mask = padded_batch([4, 4], total=4, left=False)
    with pytest.raises(ValueError, match=message):
        token_logprobs(model, input_ids, mask, **kwargs)
    with pytest.raises(ValueError, match="attention_mask"):
        token_logprobs(model, input_ids, mask[:, :3])
    with pytest.raises(ValueError, match="input_ids"):
        token_logprobs(model, input_ids[0], mask[0])


def test_unsupported_logit_transform_is_refused():
    model = tiny_model("qwen2")
    model.config.final_logit_softcapping = 30.0
    input_ids, mask = padded_batch([4], total=4, left=False)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        token_logprobs(model, input_ids, mask)


def test_right_padding_needs_no_decoder_mask_and_left_padding_keeps_it():
    right, right_mask = padded_batch([5, 2, 5], total=5, left=False)
    _, left_mask = padded_batch([5, 2, 5], total=5, left=True)
    mask, positions = decoder_inputs(right_mask)
    assert mask is None and positions.tolist() == [list(range(5))] * 3  # counting on through the padding
    mask, positions = decoder_inputs(left_mask)
    assert torch.equal(mask, left_mask.long()) and torch.equal(positions, default_position_ids(left_mask))
    holes = right_mask.clone()
    holes[0, 2] = False  # a real token after a padding position: the mask matters
    assert torch.equal(decoder_inputs(holes)[0], holes.long())


@pytest.mark.parametrize("scorer", ["token_logprobs", "critic"])
def test_right_padded_batches_reach_the_attention_without_a_mask(scorer):
    """Positions that stop at the padding made transformers see packed sequences and hand every layer a
    dense [B, 1, T, T] mask (no causal kernel, K/V copied for grouped-query attention)."""
    from ragen_lit.models import Critic

    model = tiny_model("qwen2")
    masks = []
    for layer in model.model.layers:
        layer.self_attn.register_forward_pre_hook(
            lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")), with_kwargs=True
        )
    input_ids, mask = padded_batch([6, 3, 5], total=6, left=False)
    if scorer == "critic":
        Critic(model.model, model.config.hidden_size)(input_ids, mask)
    else:
        token_logprobs(model, input_ids, mask)
    assert len(masks) == len(model.model.layers) and all(m is None for m in masks)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("left", [False, True])
def test_host_copies_of_the_masks_give_the_same_scores_and_are_what_is_read(packed, left):
    """`host_masks` (a micro-batch's CPU copies of its masks, so that the forward need not wait for the device):
    the same log-probs, entropies and values as reading the masks themselves; and the host copies are what
    decides the layout: a host score mask that selects fewer positions scores only those."""
    from ragen_lit.models import Critic

    model = tiny_model("qwen2")
    input_ids, mask = padded_batch([7, 4, 6], total=7, left=left)
    score = mask.clone()
    score[:, :3] = False
    want = token_logprobs(model, input_ids, mask, score_mask=score, with_entropy=True, packed=packed)
    got = token_logprobs(
        model, input_ids, mask, score_mask=score, with_entropy=True, packed=packed, host_masks=HostMasks(mask, score)
    )
    assert torch.equal(got.logprobs, want.logprobs) and torch.equal(got.entropy, want.entropy)
    assert (want.logprobs[:, 4:] != 0).sum() == (score[:, 4:] & mask[:, 3:-1]).sum() > 0
    fewer = score.clone()
    fewer[:, :5] = False
    narrowed = token_logprobs(
        model, input_ids, mask, score_mask=score, packed=packed, host_masks=HostMasks(mask, fewer)
    )
    assert torch.equal(narrowed.logprobs[:, 5:], want.logprobs[:, 5:]) and not narrowed.logprobs[:, :5].any()
    critic = Critic(model.model, model.config.hidden_size)
    torch.nn.init.normal_(critic.value_head.weight)
    values = critic(input_ids, mask, packed=packed)
    assert values.abs().sum() > 0
    assert torch.equal(critic(input_ids, mask, packed=packed, host_masks=HostMasks(mask)), values)
    rows, prev = scored_positions(mask, score)
    assert torch.equal(torch.stack([rows, prev], 1), (mask[:, 1:] & mask[:, :-1] & score[:, 1:]).nonzero())
    with pytest.raises(ValueError, match="host_masks must be CPU copies"):
        token_logprobs(model, input_ids, mask, host_masks=HostMasks(mask[:, 1:]))


def test_on_device_leaves_a_cpu_tensor_in_place_and_sends_it_elsewhere():
    host = torch.arange(6).view(2, 3)
    assert on_device(host, torch.device("cpu")) is host
    sent = on_device(host, torch.device("meta"))
    assert sent.device.type == "meta" and sent.shape == host.shape and sent.dtype == host.dtype


def test_pack_rows_lays_the_real_tokens_end_to_end_with_positions_restarting():
    input_ids = torch.tensor([[5, 6, 7], [8, 0, 0], [0, 9, 4]])
    mask = input_ids != 0
    packed = pack_rows(input_ids, mask)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert packed.index[mask].tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("left", [False, True])
def test_packed_rows_score_as_the_padded_batch(kind, left):
    """fp32: log-probs, entropies and gradients of the padding-free forward equal the padded forward's."""
    input_ids, mask = padded_batch([10, 6, 3, 1, 8], total=10, left=left)
    weights = torch.randn(5, 10, generator=torch.Generator().manual_seed(2))

    def scored(packed: bool):
        model = tiny_model(kind)
        out = token_logprobs(model, input_ids, mask, with_entropy=True, max_tokens_per_chunk=7, packed=packed)
        ((out.logprobs * weights).sum() + 0.3 * (out.entropy * weights.flip(1)).sum()).backward()
        return out, {name: p.grad for name, p in model.named_parameters()}

    (got, got_grads), (want, want_grads) = scored(packed=True), scored(packed=False)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy, want.entropy, atol=1e-5, rtol=0)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_rows_score_as_the_padded_batch_in_bfloat16():
    model = tiny_model("qwen2").to(torch.bfloat16)
    input_ids, mask = padded_batch([12, 5, 9, 2], total=12, left=False)
    with torch.no_grad():
        got = token_logprobs(model, input_ids, mask, with_entropy=True, packed=True)
        want = token_logprobs(model, input_ids, mask, with_entropy=True)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-3, rtol=0)
    torch.testing.assert_close(got.entropy, want.entropy, atol=1e-3, rtol=0)


def test_packed_rows_do_not_attend_across_rows():
    """Another row's tokens leave a row's scores unchanged; the same pack under one causal mask (every
    token attending to the rows before it) would change them."""
    model = tiny_model("llama")
    input_ids, mask = padded_batch([6, 7, 4], total=7, left=False)
    changed = input_ids.clone()
    changed[0, :6] = (changed[0, :6] + 11) % VOCAB
    with torch.no_grad():
        before = token_logprobs(model, input_ids, mask, packed=True).logprobs
        after = token_logprobs(model, changed, mask, packed=True).logprobs
        torch.testing.assert_close(after[1:], before[1:], atol=1e-6, rtol=0)
        assert not torch.allclose(after[0], before[0])

        def one_causal_sequence(ids):
            rows = pack_rows(ids, mask)
            ones = torch.ones_like(rows.input_ids)  # a 2D mask: transformers then sees no packed sequences
            return model.model(input_ids=rows.input_ids, attention_mask=ones, position_ids=rows.position_ids)

        leaky = one_causal_sequence(input_ids).last_hidden_state[0, 6:]
        assert not torch.allclose(one_causal_sequence(changed).last_hidden_state[0, 6:], leaky, atol=1e-3)


@pytest.mark.slow
def test_packed_rows_under_flex_attention_get_a_block_mask_and_score_as_the_padded_batch():
    """The GPU's path (`model.attention=flex_attention`): a FlexAttention block mask, no dense [N, N] mask.
    Runs without grad only: torch has no FlexAttention backward on CPU."""
    from torch.nn.attention.flex_attention import BlockMask

    model = tiny_model("qwen2")
    input_ids, mask = padded_batch([10, 6, 3, 1, 8], total=10, left=False)
    with torch.no_grad():
        want = token_logprobs(model, input_ids, mask, with_entropy=True)
        model.set_attn_implementation("flex_attention")
        masks = []
        model.model.layers[0].self_attn.register_forward_pre_hook(
            lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")), with_kwargs=True
        )
        got = token_logprobs(model, input_ids, mask, with_entropy=True, packed=True)
    assert len(masks) == 1 and isinstance(masks[0], BlockMask)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy, want.entropy, atol=1e-5, rtol=0)


def test_mean_abs_logprob_diff_hand_computed():
    sample = torch.tensor([[-1.0, -2.0], [-3.0, 0.0]])
    trainer = torch.tensor([[-1.5, -2.0], [-1.0, -9.0]])
    mask = torch.tensor([[True, True], [True, False]])
    assert mean_abs_logprob_diff(sample, trainer, mask) == pytest.approx((0.5 + 0.0 + 2.0) / 3)
    assert mean_abs_logprob_diff(sample, trainer, torch.zeros_like(mask)) == 0.0


def test_mean_abs_logprob_diff_rejects_bad_shapes_and_masks():
    sample = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one shape"):
        mean_abs_logprob_diff(sample, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        mean_abs_logprob_diff(sample, sample, torch.ones(2, 3))
