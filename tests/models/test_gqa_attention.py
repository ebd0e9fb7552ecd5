"""`fold_gqa_attention`: grouped-query attention under a mask, query heads stacked per key/value head, equals
sdpa over keys and values repeated per query head (what transformers' sdpa path computes)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen_lit.models import gqa_attention
from ragen_lit.models.gqa_attention import NAME, additive_mask, fold_gqa_attention, fold_mask, folded_gqa


def repeated(query, key, value, mask):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("length", [1, 5])
def test_folded_heads_equal_repeated_keys(kind, length):
    torch.manual_seed(0)
    batch, heads, kv_heads, cached, dim = 3, 6, 2, 7, 8
    query = torch.randn(batch, heads, length, dim)
    key, value = torch.randn(batch, kv_heads, cached + length, dim), torch.randn(batch, kv_heads, cached + length, dim)
    # each row its own padding of the cache, causal over its own tokens
    keep = torch.ones(batch, 1, length, cached + length, dtype=torch.bool)
    keep[1, ..., :3] = False
    keep[2, ..., 5:cached] = False
    keep[..., cached:] &= torch.ones(length, length, dtype=torch.bool).tril()
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    torch.testing.assert_close(fold_gqa_attention(query, key, value, mask), repeated(query, key, value, mask))
    folded = fold_mask(mask, heads // kv_heads)  # a mask folded beforehand gives the same
    torch.testing.assert_close(fold_gqa_attention(query, key, value, folded), repeated(query, key, value, mask))


def test_a_model_under_folded_gqa_gives_the_same_logits_and_gets_its_setting_back(monkeypatch):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa",
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:], mask[2, :3] = 0, 0  # right and left padding: a 4D mask reaches the attention
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        folds, conversions = [], []
        monkeypatch.setattr(gqa_attention, "fold_mask", lambda *a: folds.append(1) or fold_mask(*a))
        monkeypatch.setattr(gqa_attention, "additive_mask", lambda *a: conversions.append(1) or additive_mask(*a))
        seen = []
        sdpa = torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(
            torch.nn.functional,
            "scaled_dot_product_attention",
            lambda *a, **k: seen.append(k["attn_mask"]) or sdpa(*a, **k),
        )
        with folded_gqa(model):
            assert model.config._attn_implementation == NAME
            got = model(input_ids=ids, attention_mask=mask).logits
            assert len(folds) == len(conversions) == 1  # folded and made additive once for the forward's two layers
            model(input_ids=ids, attention_mask=mask)
            assert len(folds) == len(conversions) == 2  # a new forward, a new mask
        # sdpa gets the additive mask, not a bool one it would convert at every layer
        assert len(seen) == 4 and all(m.dtype == torch.float32 for m in seen)
    assert model.config._attn_implementation == "sdpa"
    assert not gqa_attention._last_fold  # nothing kept alive after the context
    torch.testing.assert_close(got, want)


def test_an_additive_mask_is_the_one_sdpa_makes_of_a_bool_mask():
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    keep = torch.rand(2, 1, 4, 6) > 0.3
    keep[..., 0] = True  # no row without a key
    additive = additive_mask(keep, torch.float32)
    assert additive.dtype == torch.float32 and torch.equal(additive == 0, keep)
    assert torch.isneginf(additive[~keep]).all()
    torch.testing.assert_close(
        torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=additive),
        torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=keep),
        rtol=0,
        atol=0,
    )
    assert additive_mask(additive, torch.bfloat16) is additive  # an additive mask is kept as it is
