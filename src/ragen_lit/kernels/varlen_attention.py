"""Attention of packed segments through PyTorch's kernels, and the merge of two attentions over disjoint key sets.

The cross-scorer's packed rows (`models.prefix_attention`) attend over their prompt's prefix and over their own
earlier tokens. Softmax attention over the union of two key sets is a convex combination of the attentions over
each set, weighted by their partition sums (the log-sum-exp merge of split-key and shared-prefix attention kernels):

    o = σ(λ_own − λ_pre) · o_own + σ(λ_pre − λ_own) · o_pre,   λ_S = log Σ_{k ∈ S} exp(scale · q·k)

`varlen_attention` runs variable-length segments through FlashAttention's CUDA kernel (or PyTorch's CPU flash kernel
segment by segment) and returns the partition sums; `merge_attention` merges two such attentions. This is the library
path that `kernels.row_attention`'s one-pass Triton kernel beats on CUDA, and the path everywhere else.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


class UnsupportedAttention(RuntimeError):
    """The model asked for an attention feature the packed-rows attention does not implement (sliding windows,
    logit soft-capping, attention sinks, dropout, …): the caller scores another way."""


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """Attention over the union of two key sets from the attention over each: `out_*` [T, H, D], `lse_*` [H, T] the
    log partition sums λ (float32). `σ(λ_a − λ_b) · o_a + σ(λ_b − λ_a) · o_b`, in `out_a`'s dtype (module docstring)."""
    weight_a = torch.sigmoid(lse_a - lse_b).transpose(0, 1)[..., None]  # [T, H, 1]
    merged = out_b.float() + weight_a * (out_a.float() - out_b.float())
    return merged.to(out_a.dtype)


@functools.cache
def compiled_merge():
    """`merge_attention` through `torch.compile` (made on first use): one fused kernel where eager runs ~6 passes
    over the [T, H, D] outputs in float32. Shapes become dynamic once they change (only the token count does):
    compiled with `dynamic=True` instead, heads and head size are symbols too, and on an H200 the kernel took 2.3x
    as long (0.50 against 0.22 ms at 262,144 tokens x 14 heads x 64; eager float32 2.6 ms; docs/PERFORMANCE.md)."""
    return torch.compile(merge_attention)


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
