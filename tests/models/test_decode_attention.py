"""`models.decode_attention`: a model under `split_decode_attention` steps as under sdpa and gets its setting back
(on a CPU, where Triton does not run, it stays on folded sdpa; the split kernels themselves are tested against sdpa
in tests/kernels/test_split_decode.py), and a compiled one-token forward under `folded_gqa` copies no keys."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache
from transformers.integrations import sdpa_attention

from ragen_lit.models import forward_cache_keyword
from ragen_lit.models.decode_attention import split_decode_attention
from ragen_lit.models.gqa_attention import folded_gqa


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


def test_a_model_under_split_decode_attention_steps_as_under_sdpa_and_gets_its_setting_back():
    model = small_qwen2()
    with torch.no_grad():
        want = step_after_prefill(model)
        with split_decode_attention(model):
            assert model.config._attn_implementation == "ragen_folded_gqa"  # no Triton on a CPU: folded sdpa
            got = step_after_prefill(model)
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the split kernels need CUDA")
def test_on_cuda_one_token_steps_run_the_split_kernels_and_equal_sdpa():
    model = small_qwen2().cuda()
    with torch.no_grad(), torch.device("cuda"):
        want = step_after_prefill(model)
        with split_decode_attention(model):
            assert model.config._attn_implementation == "ragen_split_decode"
            got = step_after_prefill(model)  # the prefill goes to the folded sdpa path, the step to the kernels
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


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
