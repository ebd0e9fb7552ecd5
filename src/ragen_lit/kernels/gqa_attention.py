"""Grouped-query attention under a mask without repeating keys and values.

With grouped-query attention (Qwen2.5-0.5B: 14 query heads over 2 key/value heads) and an attention mask, the
library path (transformers' sdpa integration) copies every key and value head once per query head it serves
(`repeat_kv`) before calling sdpa, because PyTorch's fused kernels take a mask or grouped heads, not both. The same
attention needs no copy of the keys: the G query heads that share a key/value head are stacked as G x T query rows of
that head, `[B, H, T, D] -> [B, H_kv, G*T, D]`, each row keeping its own mask row, so one sdpa call over the H_kv
heads reads each key once, row for row the same attention. `models.gqa_attention` switches a model to it.
"""

from __future__ import annotations

import torch


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """`mask: [B or 1, 1, T, S]` -> `[B or 1, 1, G*T, S]`, row g*T + t a copy of row t (a one-row mask, T = 1,
    broadcasts as it is)."""
    if mask.shape[2] == 1:
        return mask
    return mask[:, :, None].expand(-1, -1, groups, -1, -1).reshape(*mask.shape[:2], groups * mask.shape[2], -1)


def fold_gqa_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, **sdpa_kwargs):
    """Attention of `query: [B, H, T, D]` over `key`, `value: [B, H_kv, S, D]` (H = G x H_kv; query head h
    reads key head h // G) under `mask: [B or 1, 1, T or 1, S]` (bool or additive, shared by the heads; or
    already `fold_mask`ed), with the G query heads of a key head stacked as G x T rows of one sdpa head.
    Returns `[B, H, T, D]`, what sdpa returns over keys and values repeated G times."""
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    rows = query.reshape(batch, kv_heads, groups * length, dim)  # row g*T + t: query head kv*G + g, position t
    if mask.shape[2] == length and length != 1:
        mask = fold_mask(mask, groups)
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, **sdpa_kwargs)
    return out.reshape(batch, heads, length, dim)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True: attend) as the additive mask sdpa makes of it (0 where True, -inf elsewhere, in
    `dtype`); an additive mask as it is."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))
