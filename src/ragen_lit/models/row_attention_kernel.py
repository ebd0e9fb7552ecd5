"""The cross-scorer's rows over their own tokens, merged with their prompt's prefix attention, in one Triton kernel.

`prefix_attention.prefix_rows_attention` runs, per layer, FlashAttention's variable-length kernel twice (the rows over
their prompts' prefixes, then each row over its own earlier tokens) and merges the two by their log partition sums.
The rows are short (a reasoning of ~100 tokens), so the second call runs one mostly masked 128 × 128 tile per row and
head, and the merge reads both outputs again: 62 + 38 ms of a 1.28 s diagnostics iteration on an H200
(docs/PERFORMANCE.md, session 19). Here program (query block, row, head) runs the row's causal attention with an
online softmax over key blocks of `BLOCK_N` (grouped-query heads read their key head in place) and, in its epilogue,
merges the prefix attention's output and log partition sum (`merge_attention`'s σ(λ_a − λ_b) weights), writing the
layer's attention output once. Float32 accumulation, as FlashAttention's; equal up to rounding. Triton needs a CUDA
device, or `TRITON_INTERPRET=1` on a CPU, which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64


@triton.jit(do_not_specialize=["groups", "scale"])
def _rows_merged(
    q_ptr, k_ptr, v_ptr, cu_ptr, prefix_out_ptr, prefix_lse_ptr, out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_pt, stride_ph, stride_lh, stride_ot,
    stride_oh, groups, scale,
    HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    row = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_ptr + row)
    length = tl.load(cu_ptr + row + 1) - start
    if block * BLOCK_Q >= length:
        return
    queries = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dims = tl.arange(0, HEAD_DIM)
    valid = queries < length
    tokens = (start + queries).to(tl.int64)
    q = tl.load(q_ptr + tokens[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=valid[:, None], other=0.0)
    key_head = head // groups
    running_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], tl.float32)
    scale2 = scale * 1.4426950408889634  # scores in base 2: log2(e)
    last = tl.minimum((block + 1) * BLOCK_Q, length)  # causal: no key after the block's last query
    for first in range(0, last, BLOCK_K):
        keys = first + tl.arange(0, BLOCK_K)
        key_tokens = (start + keys).to(tl.int64)
        inside = keys < length
        k = tl.load(k_ptr + key_tokens[None, :] * stride_kt + key_head * stride_kh + dims[:, None],
                    mask=inside[None, :], other=0.0)  # fmt: skip
        scores = tl.dot(q, k) * scale2
        scores = tl.where((keys[None, :] <= queries[:, None]) & inside[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        shift = tl.where(new_max > float("-inf"), new_max, 0.0)  # a padding query sees no key: its sums stay 0
        weights = tl.exp2(scores - shift[:, None])
        rescale = tl.exp2(running_max - shift)
        running_sum = running_sum * rescale + tl.sum(weights, axis=1)
        v = tl.load(v_ptr + key_tokens[:, None] * stride_vt + key_head * stride_vh + dims[None, :],
                    mask=inside[:, None], other=0.0)  # fmt: skip
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        running_max = new_max
    total = tl.where(running_sum > 0, running_sum, 1.0)
    own = acc / total[:, None]
    own_lse = (running_max + tl.log2(total)) * 0.6931471805599453  # natural log, as FlashAttention's
    prefix_lse = tl.load(prefix_lse_ptr + head * stride_lh + start + queries, mask=valid, other=0.0)
    prefix_out = tl.load(prefix_out_ptr + tokens[:, None] * stride_pt + head * stride_ph + dims[None, :],
                         mask=valid[:, None], other=0.0).to(tl.float32)  # fmt: skip
    own_weight = 1.0 / (1.0 + tl.exp(prefix_lse - own_lse))  # σ(λ_own − λ_prefix)
    merged = prefix_out + own_weight[:, None] * (own - prefix_out)
    tl.store(out_ptr + tokens[:, None] * stride_ot + head * stride_oh + dims[None, :],
             merged.to(out_ptr.dtype.element_ty), mask=valid[:, None])  # fmt: skip


def runs_on(query: torch.Tensor) -> bool:
    """Whether the kernel takes these queries: CUDA, fp16/bf16, a head size that is a power of two from 16 to 128."""
    head_size = query.shape[-1]
    return (
        query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and 16 <= head_size <= 128
        and head_size & (head_size - 1) == 0
    )


def rows_attention_merged(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_rows: torch.Tensor,
    max_row: int,
    prefix_out: torch.Tensor,
    prefix_lse: torch.Tensor,
    scale: float,
    *,
    block_q: int = BLOCK_M,
    block_k: int = BLOCK_N,
) -> torch.Tensor:
    """Each packed row's causal attention over its own tokens (`query` [T, H, D], `key`, `value` [T, H_kv, D], row r
    the tokens `cu_rows[r] .. cu_rows[r + 1] − 1`, `max_row` the longest), merged with the attention over its
    prompt's prefix (`prefix_out` [T, H, D], `prefix_lse` [H, T] float32 natural log partition sums): the attention
    over both key sets, [T, H, D] in `query`'s dtype. Every row holds at least one token. `block_q`, `block_k`
    (powers of two, at least 16) are the kernel's tiles, for tests."""
    tokens, heads, head_dim = query.shape
    rows = cu_rows.numel() - 1
    if query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1 or prefix_out.stride(-1) != 1:
        raise ValueError("rows_attention_merged reads head dimensions that are contiguous")
    prefix_lse = prefix_lse if prefix_lse.stride(-1) == 1 else prefix_lse.contiguous()
    out = torch.empty_like(query)
    if tokens == 0 or rows == 0:
        return out
    grid = (triton.cdiv(max_row, block_q), rows, heads)
    _rows_merged[grid](
        query, key, value, cu_rows, prefix_out, prefix_lse, out,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        prefix_out.stride(0), prefix_out.stride(1), prefix_lse.stride(0), out.stride(0), out.stride(1),
        heads // key.shape[1], scale,
        HEAD_DIM=head_dim, BLOCK_Q=block_q, BLOCK_K=block_k,
    )  # fmt: skip
    return out
