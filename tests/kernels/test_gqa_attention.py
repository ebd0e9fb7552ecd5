"""`kernels.gqa_attention`: grouped-query attention under a mask, query heads stacked per key/value head, equals
sdpa over keys and values repeated per query head (what transformers' sdpa path computes)."""

from __future__ import annotations

import pytest
import torch

from ragen_lit.kernels.gqa_attention import additive_mask, fold_gqa_attention, fold_mask


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
