"""log_softmax(logits / T) at one target per row, in two Triton kernels that read the logits once.

The scoring passes without gradients and without entropy (the cross-scorer's rows, the reference log-probs) need,
per position, only its target's logit and the log-partition of the row. `torch.compile`'s fused log-softmax and
gather did that at ~1.5 TB/s on an H200 (106 ms of a diagnostics iteration's 1.34 s: 525 chunks of 1,024 × 151,936
bf16 logits; docs/PERFORMANCE.md). Here

1. `_partial_log_partition`: program (row m, chunk c) loads `CHUNK` logits of its row in one block, scales them by
   log2(e) / T and stores the chunk's maximum and Σ 2^(x − max) (base 2);
2. `_target_logprob`: program m merges its row's chunks (`merged_log_partition`, shared with the sampler's kernels)
   and stores x_target / T − log Σ_i exp(x_i / T).

Float32 throughout, as `logprobs._head_logprobs` computes it; equal up to rounding. Triton needs a CUDA device, or
`TRITON_INTERPRET=1` on a CPU, which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# logits per program of the first kernel: one block, 64 per thread at 4 warps (on an H200, 3.2 TB/s over 1,024 x
# 151,936 bf16 logits against 3.0 at 4,096 and 2.6 at 2,048; more warps were slower)
CHUNK = 8192
WARPS = 4


@triton.jit
def merged_log_partition(maxima, sums):
    """Natural log of Σ_c sums_c · 2^maxima_c: partial base-2 log-sum-exps (a chunk's maximum and its sum of 2^(x −
    maximum)) merged; -inf where every part is empty. Literals, not globals: Triton's compiler takes no plain float
    globals."""
    top = tl.max(maxima, axis=0)
    shift = tl.where(top > float("-inf"), top, 0.0)  # nothing but -inf: the sum is 0 and the log -inf
    return (shift + tl.log2(tl.sum(sums * tl.exp2(maxima - shift), axis=0))) * 0.6931471805599453


@triton.jit(do_not_specialize=["vocab", "chunks"])
def _partial_log_partition(
    logits_ptr, stride_m, max_ptr, sum_ptr, vocab, scale, chunks, CHUNK_SIZE: tl.constexpr
):  # fmt: skip
    m = tl.program_id(0)
    chunk = tl.program_id(1)
    positions = chunk * CHUNK_SIZE + tl.arange(0, CHUNK_SIZE)
    inside = positions < vocab
    row = logits_ptr + m.to(tl.int64) * stride_m
    base2 = tl.load(row + positions, mask=inside, other=float("-inf")).to(tl.float32) * scale
    top = tl.max(base2, axis=0)
    shift = tl.where(top > float("-inf"), top, 0.0)
    index = m * chunks + chunk
    tl.store(max_ptr + index, top)
    tl.store(sum_ptr + index, tl.sum(tl.exp2(base2 - shift), axis=0))


@triton.jit(do_not_specialize=["chunks"])
def _target_logprob(
    logits_ptr, stride_m, target_ptr, max_ptr, sum_ptr, out_ptr, inverse_temperature, chunks, CHUNKS: tl.constexpr
):  # fmt: skip
    m = tl.program_id(0)
    parts = tl.arange(0, CHUNKS)
    inside = parts < chunks
    maxima = tl.load(max_ptr + m * chunks + parts, mask=inside, other=float("-inf"))
    sums = tl.load(sum_ptr + m * chunks + parts, mask=inside, other=0.0)
    target = tl.load(target_ptr + m)
    chosen = tl.load(logits_ptr + m.to(tl.int64) * stride_m + target).to(tl.float32) * inverse_temperature
    tl.store(out_ptr + m, chosen - merged_log_partition(maxima, sums))


def target_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *, chunk_size: int = CHUNK
) -> torch.Tensor:
    """`log_softmax(logits.float() / temperature, -1)[m, targets[m]]` for `logits: [M, V]` and `targets: [M]` long,
    as `[M]` float32, without a `[M, V]` float32 tensor. `chunk_size` (a power of two) is the kernel's tuning, for
    tests and benchmarks."""
    if temperature <= 0:
        raise ValueError(f"target_logprobs needs a temperature above 0, got {temperature}")
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"target_logprobs takes logits [M, V] and targets [M], got {logits.shape}, {targets.shape}")
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return out
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    chunks = triton.cdiv(vocab, chunk_size)
    # two allocations, not halves of one: Triton specialises a pointer on its 16-byte alignment, and the second half's
    # offset (rows x chunks floats) is unaligned for odd row counts, a new compilation (~0.1 s on an H200) the first
    # time a chunk of an odd number of rows comes
    maxima = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    sums = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    _partial_log_partition[(rows, chunks)](
        logits, logits.stride(0), maxima, sums, vocab, 1.4426950408889634 / temperature, chunks,
        CHUNK_SIZE=chunk_size, num_warps=WARPS,
    )  # fmt: skip
    _target_logprob[(rows,)](
        logits, logits.stride(0), targets, maxima, sums, out, 1.0 / temperature, chunks,
        CHUNKS=triton.next_power_of_2(chunks),
    )  # fmt: skip
    return out
