"""One-token decode attention over a masked cache, split along the keys (flash-decoding), as two Triton kernels.

A decode step's query is one token per row, so an attention kernel that gives each (row, key/value head) one
program walks the whole cache serially: at batch 128 and 2 key/value heads (Qwen2.5-0.5B), 256 programs read
~1k-2k positions each, and sdpa's cuDNN kernel read the cache at ~12% of an H200's bandwidth in the multi-turn
bench (docs/PERFORMANCE.md). Here

1. `_flash_decode_partial`: program (row b, key/value head k, split s) takes the G query heads of head k as G rows of
   one tile and attends over the split's `SPLIT` cache positions in blocks of `BLOCK`, with an online softmax
   (FlashAttention's running maximum and sum), writing its normalised output o_s and log partition sum λ_s;
   a block whose positions the bias masks (every value at most `MASKED`, the slot's "dtype minimum" mask) is
   skipped without reading its keys and values: a row's left padding, the columns after the current step, and
   the masked steps of kept turns cost one read of their bias;
2. `_flash_decode_combine`: program (b, h) merges the splits, o = Σ_s exp(λ_s − λ) o_s with λ = log Σ_s exp(λ_s)
   (the log-sum-exp merge of partial attentions over disjoint key sets).

The same attention as softmax(q kᵀ·scale + bias) v over the unmasked positions (a row with every position masked
gets zeros, where sdpa averages the values it may not see; the decode slots give every row at least one
position). Triton needs a CUDA device (or `TRITON_INTERPRET=1` on a CPU, which the tests use where Triton is
installed); `models.decode_attention` calls `split_decode` through a custom op so that a compiled decode step
traces it as one opaque call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Cache positions per split and per block of a split, and warps per program of the first kernel: the fastest of
# splits 64-512, blocks 32-128 and 2-8 warps on an H200 at the multi-turn bench's shape (128 rows, 14 query and 2
# key/value heads of 64, caches of 1280 and 2048 positions: docs/PERFORMANCE.md). The decode slots' cache
# lengths are multiples of 256 (`decode_graphs._LENGTH_BUCKET`), so no split is partial there.
SPLIT = 128
BLOCK = 64
WARPS = 2
# A bias at or below this masks its position (the decode slots use the dtype's minimum, ~-3.4e38).
MASKED = -1.0e30


@triton.jit(do_not_specialize=["length", "splits"])  # one compilation for every cache length
def _flash_decode_partial(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    out_ptr,
    lse_ptr,
    q_stride_b,
    q_stride_h,
    k_stride_b,
    k_stride_h,
    k_stride_s,
    v_stride_b,
    v_stride_h,
    v_stride_s,
    bias_stride_b,
    bias_stride_s,
    length,
    scale,
    splits,
    GROUPS: tl.constexpr,
    ROWS: tl.constexpr,
    DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLIT_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MASKED_AT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, ROWS)  # query head kv_head * GROUPS + row; rows >= GROUPS are padding
    dims = tl.arange(0, DIM_PAD)  # dims >= DIM too (matrix products take at least 16)
    in_dim = dims < DIM
    heads = kv_head * GROUPS + rows
    query = tl.load(
        q_ptr + b * q_stride_b + heads[:, None] * q_stride_h + dims[None, :],
        mask=(rows[:, None] < GROUPS) & in_dim[None, :],
        other=0.0,
    )
    running_max = tl.full([ROWS], float("-inf"), tl.float32)
    running_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, DIM_PAD], tl.float32)
    k_base = k_ptr + b * k_stride_b + kv_head * k_stride_h
    v_base = v_ptr + b * v_stride_b + kv_head * v_stride_h
    for block in range(0, SPLIT_SIZE, BLOCK_SIZE):
        positions = split * SPLIT_SIZE + block + tl.arange(0, BLOCK_SIZE)
        inside = positions < length
        bias = tl.load(bias_ptr + b * bias_stride_b + positions * bias_stride_s, mask=inside, other=MASKED_AT)
        bias = bias.to(tl.float32)
        if tl.max(bias, axis=0) > MASKED_AT:
            load_mask = inside[:, None] & in_dim[None, :]
            keys = tl.load(k_base + positions[:, None] * k_stride_s + dims[None, :], mask=load_mask, other=0.0)
            scores = tl.dot(query, tl.trans(keys), input_precision=PRECISION).to(tl.float32) * scale + bias[None, :]
            scores = tl.where((bias > MASKED_AT)[None, :], scores, float("-inf"))
            block_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp(running_max - block_max)
            weights = tl.exp(scores - block_max[:, None])
            values = tl.load(v_base + positions[:, None] * v_stride_s + dims[None, :], mask=load_mask, other=0.0)
            acc = acc * rescale[:, None] + tl.dot(weights.to(values.dtype), values, input_precision=PRECISION).to(
                tl.float32
            )
            running_sum = running_sum * rescale + tl.sum(weights, axis=1)
            running_max = block_max
    attended = running_sum > 0
    out = acc / tl.where(attended, running_sum, 1.0)[:, None]
    lse = tl.where(attended, running_max + tl.log(tl.where(attended, running_sum, 1.0)), float("-inf"))
    # partials: out [B, H, splits, DIM], lse [B, H, splits], both float32 and contiguous
    row_index = (b * GROUPS * tl.num_programs(1) + heads) * splits + split
    tl.store(out_ptr + row_index[:, None] * DIM + dims[None, :], out, mask=(rows[:, None] < GROUPS) & in_dim[None, :])
    tl.store(lse_ptr + row_index, lse, mask=rows < GROUPS)


@triton.jit(do_not_specialize=["splits"])
def _flash_decode_combine(
    part_ptr,
    lse_ptr,
    out_ptr,
    out_stride_b,
    out_stride_h,
    heads,
    splits,
    SPLITS: tl.constexpr,
    DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    index = tl.arange(0, SPLITS)
    dims = tl.arange(0, DIM_PAD)
    in_dim = dims < DIM
    base = (b * heads + head) * splits
    lse = tl.load(lse_ptr + base + index, mask=index < splits, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no split attended: every weight is 0
    weights = tl.exp(lse - top)
    total = tl.sum(weights, axis=0)
    parts = tl.load(
        part_ptr + (base + index)[:, None] * DIM + dims[None, :],
        mask=(index < splits)[:, None] & in_dim[None, :],
        other=0.0,
    )
    out = tl.sum(parts * weights[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * out_stride_b + head * out_stride_h + dims, out.to(out_ptr.dtype.element_ty), mask=in_dim)


def split_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor,
    scale: float | None = None,
    *,
    split_size: int = SPLIT,
    block_size: int = BLOCK,
    num_warps: int = WARPS,
) -> torch.Tensor:
    """softmax(q kᵀ·scale + bias) v for `query: [B, H, 1, D]` over `key`, `value: [B, H_kv, S, D]` (query head h
    reads key head h // G), `bias: [B, S]` added to every head's scores (0 to attend, at most `MASKED` not to).
    Returns `[B, H, 1, D]` in the query's dtype. `split_size` (a multiple of `block_size`, both powers of two) and
    `num_warps` (per program of the first kernel) are the kernel's tuning, for benchmarks."""
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    batch, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = dim**-0.5 if scale is None else scale
    splits = triton.cdiv(length, split_size)
    partial = torch.empty(batch, heads, splits, dim, dtype=torch.float32, device=query.device)
    lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=query.device)
    _flash_decode_partial[(batch, kv_heads, splits)](
        query,
        key,
        value,
        bias,
        partial,
        lse,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        key.stride(2),
        value.stride(0),
        value.stride(1),
        value.stride(2),
        bias.stride(0),
        bias.stride(1),
        length,
        scale,
        splits,
        GROUPS=groups,
        ROWS=max(16, triton.next_power_of_2(groups)),
        DIM=dim,
        DIM_PAD=max(16, triton.next_power_of_2(dim)),
        SPLIT_SIZE=split_size,
        BLOCK_SIZE=block_size,
        MASKED_AT=MASKED,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",  # float32: no TF32 rounding of the products
        num_warps=num_warps,
    )
    out = torch.empty(batch, heads, 1, dim, dtype=query.dtype, device=query.device)
    _flash_decode_combine[(batch, heads)](
        partial,
        lse,
        out,
        out.stride(0),
        out.stride(1),
        heads,
        splits,
        SPLITS=triton.next_power_of_2(splits),
        DIM=dim,
        DIM_PAD=max(16, triton.next_power_of_2(dim)),
    )
    return out
