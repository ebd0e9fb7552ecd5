"""Packed rows over shared prompt prefixes: the cross-scorer's attention without per-row copies, masks or padding.

The cross-scorer (`metrics.cross_scoring`) scores every reasoning z_r under every prompt x_j: each prompt's prefix
is encoded once, and each (prompt, reasoning) row then attends over that prefix and over its own earlier tokens.
Softmax attention over the union of two key sets is a convex combination of the attentions over each set, weighted
by their partition sums (the log-sum-exp merge of split-key and shared-prefix attention kernels):

    o = σ(λ_own − λ_pre) · o_own + σ(λ_pre − λ_own) · o_pre,   λ_S = log Σ_{k ∈ S} exp(scale · q·k)

so a forward over packed rows runs two variable-length attentions and merges them (`merge_attention`):

- own: every row's tokens over that row's earlier tokens (causal, one segment per row);
- prefix: all tokens of prompt j's rows over prompt j's prefix (not causal, one segment per prompt; the rows are
  sorted by prompt), read from one packed copy of the prefixes' keys and values per layer, never gathered per row.

No work goes to padding and no mask exists. On CUDA in fp16/bf16 both attentions run as one Triton kernel, one
online softmax over the prefix's keys and then the row's own (`models.row_attention_kernel`); where it does not apply
the prefix attention runs FlashAttention's variable-length kernel (`varlen_attention`, grouped-query heads native),
the own attention too, and a compiled merge; on a CPU each segment runs on its own through PyTorch's CPU flash
kernel. Where neither runs (fp32 on CUDA, older GPUs, other devices) the attention raises `UnsupportedAttention` and
the scorer takes its masked path. `packed_rows(model,
segments)` switches a model's attention to `prefix_rows_attention` for the calls inside it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import AttentionInterface

from ragen_lit.logprobs import triton_runs_on
from ragen_lit.models.gqa_attention import MASKED_ATTENTION

NAME = "ragen_prefix_rows"
# `diagnostics.attention`: "varlen" is this module's attention; the others are masked sdpa over gathered prefixes
SCORER_ATTENTION = ("varlen", *MASKED_ATTENTION)


class UnsupportedAttention(RuntimeError):
    """The model asked for an attention feature the packed-rows attention does not implement (sliding windows,
    logit soft-capping, attention sinks, dropout, …): the caller scores another way."""


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
    prefixes and rows (`models.row_attention_kernel`)"""
    captured: dict[int, tuple[Tensor, Tensor]] | None = None
    """if given, every layer's attention stores its keys and values [T, H_kv, D] here under its layer index: the
    prefixes' forward leaves them as the rows' `prefixes`, without a KV cache (whose forwards run uncompiled)"""


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """Attention over the union of two key sets from the attention over each: `out_*` [T, H, D], `lse_*` [H, T] the
    log partition sums λ (float32). `σ(λ_a − λ_b) · o_a + σ(λ_b − λ_a) · o_b`, in `out_a`'s dtype (module docstring)."""
    weight_a = torch.sigmoid(lse_a - lse_b).transpose(0, 1)[..., None]  # [T, H, 1]
    merged = out_b.float() + weight_a * (out_a.float() - out_b.float())
    return merged.to(out_a.dtype)


def varlen_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_queries: Tensor,
    cu_keys: Tensor,
    max_queries: int,
    max_keys: int,
    *,
    causal: bool,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """Attention of packed segments: segment s's queries `query[cu_queries[s]:cu_queries[s+1]]` over its keys
    `key[cu_keys[s]:cu_keys[s+1]]` (query [T, H, D]; key, value [S, H_kv, D], H a multiple of H_kv; query head h
    reads key head h // (H / H_kv)). `causal`: a segment's queries are its keys (self-attention, each token over
    itself and the earlier ones). A segment may hold no queries; every segment with queries needs keys.

    Returns `(out [T, H, D], lse [H, T] float32)`, lse the natural log of each query's partition sum. Runs where
    PyTorch has a kernel that returns the partition sums: FlashAttention's on CUDA (fp16/bf16, compute capability
    8.0 or later, head size a multiple of 8 up to 256), its CPU flash kernel segment by segment on a CPU; elsewhere
    it raises `UnsupportedAttention`."""
    if query.device.type == "cpu":
        return _segment_by_segment(query, key, value, cu_queries.tolist(), cu_keys.tolist(), causal=causal, scale=scale)
    if not _flash_runs(query):
        raise UnsupportedAttention(
            f"no variable-length kernel for {query.dtype} queries of head size {query.shape[-1]} on {query.device}"
        )
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        query, key, value, cu_queries, cu_keys, max_queries, max_keys, 0.0, causal, False, scale=scale
    )
    return out, lse


def _flash_runs(query: Tensor) -> bool:
    """Whether FlashAttention's CUDA kernel takes these queries (what PyTorch's build of it supports)."""
    head_size = query.shape[-1]
    return (
        query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and torch.cuda.get_device_capability(query.device) >= (8, 0)
        and head_size % 8 == 0
        and head_size <= 256
    )


def _segment_by_segment(
    query: Tensor, key: Tensor, value: Tensor, cu_queries: list[int], cu_keys: list[int], *, causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """`varlen_attention` on a CPU: each segment through PyTorch's CPU flash kernel (the key heads repeated per
    query head)."""
    groups = query.shape[1] // key.shape[1]
    out = query.new_zeros(query.shape)
    lse = query.new_zeros(query.shape[1], query.shape[0], dtype=torch.float32)
    for s in range(len(cu_queries) - 1):
        q0, q1, k0, k1 = cu_queries[s], cu_queries[s + 1], cu_keys[s], cu_keys[s + 1]
        if q1 == q0:
            continue
        q = query[q0:q1].transpose(0, 1)[None]  # [1, H, n, D]
        k = key[k0:k1].repeat_interleave(groups, dim=1).transpose(0, 1)[None]
        v = value[k0:k1].repeat_interleave(groups, dim=1).transpose(0, 1)[None]
        o, log_sum = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        out[q0:q1] = o[0].transpose(0, 1)
        lse[:, q0:q1] = log_sum[0]
    return out, lse


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
        from ragen_lit.models.row_attention_kernel import rows_over_prefix, runs_on

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
    out = (_compiled_merge() if out.is_cuda else merge_attention)(out, lse, out_prefix, lse_prefix)
    return out[None], None


@functools.cache
def _compiled_merge():
    """`merge_attention` through `torch.compile` (made on first use): one fused kernel where eager runs ~6 passes
    over the [T, H, D] outputs in float32. Shapes become dynamic once they change (only the token count does):
    compiled with `dynamic=True` instead, heads and head size are symbols too, and on an H200 the kernel took 2.3x
    as long (0.50 against 0.22 ms at 262,144 tokens x 14 heads x 64; eager float32 2.6 ms; docs/PERFORMANCE.md)."""
    return torch.compile(merge_attention)


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
