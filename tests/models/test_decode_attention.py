"""`models.decode_attention`: the one-token decode kernels equal sdpa over repeated keys and values, a model under
`decode_attention` gives the same logits, and a compiled one-token forward under `folded_gqa` copies no keys."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache
from transformers.integrations import sdpa_attention

from ragen_lit.models import forward_cache_keyword
from ragen_lit.models.decode_attention import KERNELS, decode_attention, flex_decode, matmul_decode, split_decode
from ragen_lit.models.gqa_attention import folded_gqa


def repeated(query, key, value, bias):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias[:, None, None, :])


def decode_case(heads=6, kv_heads=2, dim=16):
    """One query token per row over 3 rows of 32 cached positions, each row masking its own positions."""
    torch.manual_seed(0)
    batch, length = 3, 32
    query = torch.randn(batch, heads, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    keep = torch.ones(batch, length, dtype=torch.bool)
    keep[0, 20:] = False  # the unused end of a cache bucket
    keep[1, :5] = False  # left padding
    keep[2, 7:12] = False
    bias = torch.zeros(batch, length).masked_fill(~keep, torch.finfo(torch.float32).min)
    return query, key, value, bias


@pytest.mark.parametrize("kernel", [flex_decode, matmul_decode, split_decode], ids=["flex", "matmul", "split"])
@pytest.mark.parametrize("heads", [6, 14], ids=["G3", "G7"])  # 7: Qwen2.5-0.5B's group, not a power of two
def test_decode_kernels_equal_sdpa_over_repeated_keys(kernel, heads):
    query, key, value, bias = decode_case(heads=heads)
    want = repeated(query, key, value, bias)
    torch.testing.assert_close(kernel(query, key, value, bias), want)
    # an explicit scale is the scale used (here twice the default)
    torch.testing.assert_close(
        kernel(query, key, value, bias, scale=2 / 16**0.5), repeated(query * 2, key, value, bias), atol=2e-5, rtol=1e-4
    )


def test_masked_positions_get_no_weight():
    query, key, value, bias = decode_case()
    value_poisoned = value.clone()
    value_poisoned[0, :, 20:] = 1e4  # masked in row 0 only
    for kernel in (flex_decode, matmul_decode, split_decode):
        torch.testing.assert_close(kernel(query, key, value_poisoned, bias)[0], kernel(query, key, value, bias)[0])


def small_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=50, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa",
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def prefill(model, prompt_ids):
    """Prefill `prompt_ids` (row 1 left-padded by 2) into a static cache of 16 positions; return the cache, the
    additive 4D mask of the next step and its positions, as the graph cache's steps get them."""
    batch, width = prompt_ids.shape
    cache = StaticCache(config=model.config, max_cache_len=16)
    keep = torch.ones(batch, width, dtype=torch.long)
    keep[1, :2] = 0
    positions = (keep.cumsum(-1) - 1).clamp(min=0)
    cache_kw = {forward_cache_keyword(model): cache}
    model(input_ids=prompt_ids, attention_mask=keep, position_ids=positions, use_cache=True, **cache_kw)
    mask = torch.full((batch, 1, 1, 16), torch.finfo(torch.float32).min)
    mask[:, 0, 0, : width + 1] = 0
    mask[1, 0, 0, :2] = torch.finfo(torch.float32).min
    return cache, mask, positions[:, -1:] + 1


def one_token_step(model, next_ids, mask, positions, cache):
    """Logits `[B, V]` of one one-token forward over the cache."""
    cache_kw = {forward_cache_keyword(model): cache}
    out = model(input_ids=next_ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache_kw)
    return out.logits[:, -1]


def step_after_prefill(model, step=one_token_step):
    torch.manual_seed(1)
    prompt_ids, next_ids = torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 1))
    cache, mask, positions = prefill(model, prompt_ids)
    return step(model, next_ids, mask, positions, cache)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_model_under_decode_attention_steps_as_under_sdpa_and_gets_its_setting_back(kernel):
    model = small_qwen2()
    with torch.no_grad():
        want = step_after_prefill(model)
        with decode_attention(model, kernel):
            assert model.config._attn_implementation == f"ragen_decode_{kernel}"
            got = step_after_prefill(model)  # the prefill goes to the folded sdpa path
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel must be one of"):
        with decode_attention(small_qwen2(), "flash"):
            pass


def test_a_compiled_one_token_step_under_folded_gqa_repeats_no_keys(monkeypatch):
    """transformers folds the query heads of a one-token step itself, but not inside torch.compile, where it
    repeats every key and value head (a compiled decode step copied each layer's whole cache per step)."""
    repeats = []
    original = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: repeats.append(1) or original(*a))
    model = small_qwen2()
    torch._dynamo.reset()
    compiled = torch.compile(one_token_step)

    def counted_step(*args):  # counts the step's repeats only, not the prefill's
        repeats.clear()
        return compiled(*args)

    with torch.no_grad():
        want = step_after_prefill(model)
        with folded_gqa(model):
            got = step_after_prefill(model, counted_step)
        assert not repeats
        step_after_prefill(model, counted_step)  # without the fold, the traced step repeats the keys
        assert repeats
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
