"""The cross-scorer's attention in one Triton kernel: each packed row over its prompt's prefix and its own earlier
tokens.

`prefix_attention.prefix_rows_attention` attends a forward's packed rows `[x_{P−1} | z_r]` over their prompt's
prefix (not causal: prompt j's rows over prompt j's keys) and over their own earlier tokens (causal, one segment per
row), and merges the two softmaxes by their log partition sums. Run as FlashAttention's variable-length kernel over
the prefixes, then a kernel over the rows' own tokens with the merge in its epilogue, the two passes wrote and read
the prefix attention's output and log partition sums again: 141 + 40 ms of a 1.23-1.30 s diagnostics iteration on
an H200 (docs/PERFORMANCE.md). Here program (query block, prompt, head) runs one online softmax over both
key sets: the prompt's prefix in blocks of `BLOCK_K` keys, then the keys of its rows from the first query's row start
to the block's end, masked to the query's own row and not after it (token t's row starts at `row_starts[t]`), and
writes the output once. Grouped-query heads read their key head in place; float32 accumulation and scores scaled in
float32, as FlashAttention's: equal up to rounding (on an H200 the scorer's shapes ran 20-25% faster than the two
passes). Triton needs a CUDA device, or `TRITON_INTERPRET=1` on a CPU, which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# the tiles measured fastest at the scorer's shapes on an H200: 128 queries, 32 keys, 4 warps, 3 stages
BLOCK_Q = 128
BLOCK_K = 32


@triton.jit
def _online_softmax_step(scores, v, running_max, running_sum, acc):
    """One key block of the online softmax (scores in base 2, -inf where masked): the new running max, sum and
    accumulator. A query that has seen no key keeps a zero sum and accumulator."""
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    shift = tl.where(new_max > float("-inf"), new_max, 0.0)
    weights = tl.exp2(scores - shift[:, None])
    rescale = tl.exp2(running_max - shift)
    running_sum = running_sum * rescale + tl.sum(weights, axis=1)
    acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
    return new_max, running_sum, acc


@triton.jit
def _prefix_block(
    q, pk_ptr, pv_ptr, first, prefix_end, key_head, stride_pkt, stride_pkh, stride_pvt, stride_pvh, dims, scale2,
    running_max, running_sum, acc, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """The online softmax over the prefix keys `first .. first + BLOCK_K − 1`; `MASKED`: those at `prefix_end` or after
    are left out (the last block; the full ones skip the mask, ~5% of the kernel's time at the scorer's shapes)."""
    keys = (first + tl.arange(0, BLOCK_K)).to(tl.int64)
    k_ptrs = pk_ptr + keys[None, :] * stride_pkt + key_head * stride_pkh + dims[:, None]
    v_ptrs = pv_ptr + keys[:, None] * stride_pvt + key_head * stride_pvh + dims[None, :]
    if MASKED:
        inside = keys < prefix_end
        k = tl.load(k_ptrs, mask=inside[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=inside[:, None], other=0.0)
        scores = tl.where(inside[None, :], tl.dot(q, k) * scale2, float("-inf"))
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
        scores = tl.dot(q, k) * scale2
    return _online_softmax_step(scores, v, running_max, running_sum, acc)


@triton.jit(do_not_specialize=["groups", "scale"])
def _rows_over_prefix(
    q_ptr, k_ptr, v_ptr, pk_ptr, pv_ptr, cu_q_ptr, cu_p_ptr, starts_ptr, out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_pkt, stride_pkh, stride_pvt, stride_pvh,
    stride_ot, stride_oh, groups, scale,
    HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    segment = tl.program_id(1)
    head = tl.program_id(2)
    begin = tl.load(cu_q_ptr + segment) + block * BLOCK_Q
    end = tl.load(cu_q_ptr + segment + 1)
    if begin >= end:
        return
    tokens = begin + tl.arange(0, BLOCK_Q)
    valid = tokens < end
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + tokens.to(tl.int64)[:, None] * stride_qt + head * stride_qh + dims[None, :],
                mask=valid[:, None], other=0.0)  # fmt: skip
    scale2 = scale * 1.4426950408889634  # scores in base 2: log2(e)
    key_head = head // groups
    running_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], tl.float32)
    # the prompt's prefix: every key, no causal mask; the full blocks unmasked, then the last one masked
    prefix_start = tl.load(cu_p_ptr + segment)
    prefix_end = tl.load(cu_p_ptr + segment + 1)
    full_end = prefix_start + (prefix_end - prefix_start) // BLOCK_K * BLOCK_K
    for first in range(prefix_start, full_end, BLOCK_K):
        running_max, running_sum, acc = _prefix_block(
            q, pk_ptr, pv_ptr, first, prefix_end, key_head, stride_pkt, stride_pkh, stride_pvt, stride_pvh, dims,
            scale2, running_max, running_sum, acc, BLOCK_K, False,
        )  # fmt: skip
    if full_end < prefix_end:
        running_max, running_sum, acc = _prefix_block(
            q, pk_ptr, pv_ptr, full_end, prefix_end, key_head, stride_pkt, stride_pkh, stride_pvt, stride_pvh, dims,
            scale2, running_max, running_sum, acc, BLOCK_K, True,
        )  # fmt: skip
    # the rows' own tokens: a key of the same row (same start), not after the query
    starts = tl.load(starts_ptr + tokens, mask=valid, other=-1)
    own_end = tl.minimum(begin + BLOCK_Q, end)
    for first in range(tl.load(starts_ptr + begin), own_end, BLOCK_K):
        keys = first + tl.arange(0, BLOCK_K)
        inside = keys < own_end
        key_rows = keys.to(tl.int64)
        key_starts = tl.load(starts_ptr + keys, mask=inside, other=-2)
        k = tl.load(k_ptr + key_rows[None, :] * stride_kt + key_head * stride_kh + dims[:, None],
                    mask=inside[None, :], other=0.0)  # fmt: skip
        v = tl.load(v_ptr + key_rows[:, None] * stride_vt + key_head * stride_vh + dims[None, :],
                    mask=inside[:, None], other=0.0)  # fmt: skip
        seen = (key_starts[None, :] == starts[:, None]) & (keys[None, :] <= tokens[:, None])
        scores = tl.where(seen, tl.dot(q, k) * scale2, float("-inf"))
        running_max, running_sum, acc = _online_softmax_step(scores, v, running_max, running_sum, acc)
    out = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * stride_ot + head * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=valid[:, None])  # fmt: skip


def rows_over_prefix(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    prefix_key: torch.Tensor,
    prefix_value: torch.Tensor,
    cu_queries: torch.Tensor,
    cu_prefix: torch.Tensor,
    row_starts: torch.Tensor,
    max_queries: int,
    scale: float,
    *,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """Each packed row's attention over its prompt's prefix and its own earlier tokens, in one pass: `query` [T, H, D],
    `key`, `value` [T, H_kv, D] the rows' tokens, prompt j's rows the tokens `cu_queries[j] .. cu_queries[j + 1] − 1`
    (`max_queries` the most of any prompt), attending over `prefix_key`, `prefix_value` [P, H_kv, D] positions
    `cu_prefix[j] .. cu_prefix[j + 1] − 1` (not causal) and over their own row's tokens up to themselves (token t's
    row starts at `row_starts[t]`, int32 [T]). Returns [T, H, D] contiguous, in `query`'s dtype. Every row holds at
    least one token; a prompt may have no rows or an empty prefix. `block_q`, `block_k` (powers of two, at least 16),
    `num_warps` and `num_stages` are the kernel's launch configuration, for tests and benchmarks."""
    tokens, heads, head_dim = query.shape
    if any(t.stride(-1) != 1 for t in (query, key, value, prefix_key, prefix_value)):
        raise ValueError("rows_over_prefix reads head dimensions that are contiguous")
    out = query.new_empty(tokens, heads, head_dim)
    segments = cu_queries.numel() - 1
    if tokens == 0 or segments == 0:
        return out
    grid = (triton.cdiv(max_queries, block_q), segments, heads)
    _rows_over_prefix[grid](
        query, key, value, prefix_key, prefix_value, cu_queries, cu_prefix, row_starts, out,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        prefix_key.stride(0), prefix_key.stride(1), prefix_value.stride(0), prefix_value.stride(1),
        out.stride(0), out.stride(1), heads // key.shape[1], scale,
        HEAD_DIM=head_dim, BLOCK_Q=block_q, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def runs_on(query: torch.Tensor) -> bool:
    """Whether the kernel takes these queries: CUDA, fp16/bf16, a head size that is a power of two from 16 to 128."""
    head_size = query.shape[-1]
    return (
        query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and 16 <= head_size <= 128
        and head_size & (head_size - 1) == 0
    )
