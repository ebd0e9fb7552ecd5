"""Packed rows over shared prompt prefixes: the cross-scorer's attention without per-row copies, masks or padding.

The cross-scorer (`metrics.cross_scoring`) scores every reasoning z_r under every prompt x_j: each prompt's prefix
is encoded once, and each (prompt, reasoning) row then attends over that prefix and over its own earlier tokens,
two attentions merged by their log partition sums (`kernels.varlen_attention`):

- own: every row's tokens over that row's earlier tokens (causal, one segment per row);
- prefix: all tokens of prompt j's rows over prompt j's prefix (not causal, one segment per prompt; the rows are
  sorted by prompt), read from one packed copy of the prefixes' keys and values per layer, never gathered per row.

No work goes to padding and no mask exists. On CUDA in fp16/bf16 both attentions run as one Triton kernel, one
online softmax over the prefix's keys and then the row's own (`kernels.row_attention`); where it does not apply
both run FlashAttention's variable-length kernel (grouped-query heads native) and a compiled merge; on a CPU each
segment runs on its own through PyTorch's CPU flash kernel. Where neither runs (fp32 on CUDA, older GPUs, other
devices) the attention raises `UnsupportedAttention` and the scorer takes its masked path. `packed_rows(model,
segments)` switches a model's attention to `prefix_rows_attention` for the calls inside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import AttentionInterface

from ragen_lit.kernels import triton_runs_on
from ragen_lit.kernels.varlen_attention import UnsupportedAttention, compiled_merge, merge_attention, varlen_attention

NAME = "ragen_prefix_rows"


@dataclass(frozen=True)
class RowSegments:
    """Where the segments of a packed forward lie. Cumulative offsets are int32 [n + 1] on the model's device, the
    longest segments host ints (what the variable-length kernel takes)."""

    cu_rows: Tensor
    """row r's tokens are packed positions cu_rows[r] .. cu_rows[r + 1] − 1"""
    max_row: int
    cu_queries: Tensor | None = None
    """prompt j's rows' tokens are packed positions cu_queries[j] .. cu_queries[j + 1] − 1 (may be empty)"""
    max_queries: int = 0
    cu_prefix: Tensor | None = None
    """prompt j's prefix is positions cu_prefix[j] .. cu_prefix[j + 1] − 1 of each layer's `prefixes`"""
    max_prefix: int = 0
    prefixes: list[tuple[Tensor, Tensor]] | None = None
    """per decoder layer, the prefixes' keys and values [N_prefix, H_kv, D] (after the rotary embedding); None: the
    rows attend over themselves only (the prefixes' own forward)"""
    row_starts: Tensor | None = None
    """int32 [T]: where each token's row starts (`cu_rows[r]` of its row r), for the one-kernel attention over
    prefixes and rows (`kernels.row_attention`)"""
    captured: dict[int, tuple[Tensor, Tensor]] | None = None
    """if given, every layer's attention stores its keys and values [T, H_kv, D] here under its layer index: the
    prefixes' forward leaves them as the rows' `prefixes`, without a KV cache (whose forwards run uncompiled)"""


# the segments of the forward running inside `packed_rows`
_active: list[RowSegments] = []
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "position_bias")


@torch.compiler.disable  # its segment bounds change at every call: a graph break, not a recompilation per call
def prefix_rows_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """transformers' attention-function signature, for one packed sequence (`query` [1, H, T, D], `key`, `value`
    [1, H_kv, T, D]): each row over its own earlier tokens, merged with its prompt's prefix (`RowSegments`).
    Returns `[1, T, H, D]`."""
    used = [name for name in _UNSUPPORTED if kwargs.get(name) is not None]
    if dropout or used or query.shape[0] != 1:
        raise UnsupportedAttention(f"packed-rows attention cannot apply {used or 'dropout or a batch of rows'}")
    segments = _active[-1]
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise UnsupportedAttention(f"{type(module).__name__} does not name its layer (layer_idx)")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    if segments.captured is not None:
        segments.captured[layer] = (k, v)

    def own() -> tuple[Tensor, Tensor]:  # each row over its own earlier tokens
        rows, longest = segments.cu_rows, segments.max_row
        return varlen_attention(q, k, v, rows, rows, longest, longest, causal=True, scale=scale)

    if segments.prefixes is None:
        return own()[0][None], None
    prefix_keys, prefix_values = segments.prefixes[layer]
    if segments.row_starts is not None and triton_runs_on(q.device):
        from ragen_lit.kernels.row_attention import rows_over_prefix, runs_on

        if runs_on(q):  # the prefix's keys and the row's own in one online softmax
            out = rows_over_prefix(
                q,
                k,
                v,
                prefix_keys,
                prefix_values,
                segments.cu_queries,
                segments.cu_prefix,
                segments.row_starts,
                segments.max_queries,
                scale,
            )
            return out[None], None
    out_prefix, lse_prefix = varlen_attention(
        q,
        prefix_keys,
        prefix_values,
        segments.cu_queries,
        segments.cu_prefix,
        segments.max_queries,
        segments.max_prefix,
        causal=False,
        scale=scale,
    )
    out, lse = own()
    out = (compiled_merge() if out.is_cuda else merge_attention)(out, lse, out_prefix, lse_prefix)
    return out[None], None


AttentionInterface.register(NAME, prefix_rows_attention)


@contextmanager
def packed_rows(model: torch.nn.Module, segments: RowSegments) -> Iterator[None]:
    """Inside: `model`'s attention layers run `prefix_rows_attention` over `segments` (no attention mask is built:
    transformers makes none for an implementation without a mask function)."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    _active.append(segments)
    try:
        yield
    finally:
        _active.pop()
        config._attn_implementation = previous
