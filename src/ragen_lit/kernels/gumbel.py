"""A draw from softmax(logits / T) per row and its log-prob, in two Triton kernels that make their own uniforms.

`hf.gumbel_max` draws a `[B, V]` tensor of uniforms (written by one kernel, read back by the next) and reduces each
row in one program: at the multi-turn bench's 128 rows of 151,936 logits that is 78 MB of uniforms per decode step
and 128 programs on a 132-SM GPU. Here

1. `_gumbel_partial`: program (row b, chunk c) walks `CHUNK` logits of its row, makes each position's uniform with
   Triton's Philox generator (`tl.rand(seed, b * V + i)`: counter-based, so the draw depends only on the seed and the
   position, never on the grid), and keeps three running values: the chunk's best Gumbel-perturbed score
   x_i / T − log(−log u_i) and its position, and an online log-sum-exp of x_i / T;
2. `_gumbel_combine`: program b takes the best chunk (the first on ties) and merges the log-sum-exps, giving the
   token and its log-prob x_t / T − log Σ_i exp(x_i / T).

The Gumbel-max trick: argmax_i (x_i / T + G_i) with G_i = −log(−log u_i) i.i.d. standard Gumbel is distributed as
softmax(x / T), so this is the same distribution as `gumbel_max`'s, with other draws. The seed is a one-element
device tensor (drawn from the caller's generator), so no step waits for the host. Triton needs a CUDA device, or
`TRITON_INTERPRET=1` on a CPU, which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragen_lit.kernels.logprob import merged_log_partition

# Logits per program of the first kernel, and per block of its loop (four quarters, one Philox call per four
# logits): the fastest of chunks 2k-16k and blocks 512-2048 on an H200 at 128 x 151,936 bf16 logits
# (docs/PERFORMANCE.md).
CHUNK = 4096
BLOCK = 1024
WARPS = 4


@triton.jit
def _uniform(bits):
    """A uniform in (0, 1) from 32 random bits: the top 23 as the midpoint of one of 2^23 equal cells, 2^-24 to
    1 - 2^-24, both exact in float32 (never 0 or 1, so both logarithms of the Gumbel noise are finite)."""
    return ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def _accumulate(logits_ptr, positions, vocab, inverse_temperature, bits, best, best_index, running_max, running_sum):
    """One quarter block into the per-lane accumulators: the best perturbed score (strictly better only, so a lane
    keeps its first position on ties) and an online log-sum-exp in base 2 of the scaled logits."""
    inside = positions < vocab
    scaled = tl.load(logits_ptr + positions, mask=inside, other=float("-inf")).to(tl.float32) * inverse_temperature
    # Gumbel noise -log(-log u) in base-2 logarithms, ln 2 = 0.6931... (literals: Triton's compiler takes no plain
    # float globals, and its interpreter mishandles constexpr ones in arithmetic)
    noise = -0.6931471805599453 * tl.log2(-0.6931471805599453 * tl.log2(_uniform(bits)))
    perturbed = tl.where(inside, scaled + noise, float("-inf"))
    better = perturbed > best
    best_index = tl.where(better, positions, best_index)
    best = tl.where(better, perturbed, best)
    base2 = scaled * 1.4426950408889634  # log2(e)
    new_max = tl.maximum(running_max, base2)
    shift = tl.where(new_max > float("-inf"), new_max, 0.0)  # nothing but -inf so far: the sum stays 0
    running_sum = running_sum * tl.exp2(running_max - shift) + tl.exp2(base2 - shift)
    return best, best_index, new_max, running_sum


@triton.jit(do_not_specialize=["vocab", "chunks"])
def _gumbel_partial(
    logits_ptr,
    stride_b,
    seed_ptr,
    best_ptr,
    index_ptr,
    max_ptr,
    sum_ptr,
    vocab,
    inverse_temperature,
    chunks,
    CHUNK_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    seed = tl.load(seed_ptr)
    row = logits_ptr + b * stride_b
    quarter: tl.constexpr = BLOCK_SIZE // 4
    lanes = tl.arange(0, quarter)
    best = tl.full([quarter], float("-inf"), tl.float32)
    best_index = tl.zeros([quarter], tl.int32)
    running_max = tl.full([quarter], float("-inf"), tl.float32)
    running_sum = tl.zeros([quarter], tl.float32)
    for block in range(0, CHUNK_SIZE, BLOCK_SIZE):
        start = chunk * CHUNK_SIZE + block
        # one Philox call per four logits; its counter names the quad, so the draws depend on the seed and the
        # positions (and BLOCK_SIZE), not on the chunking
        bits0, bits1, bits2, bits3 = tl.randint4x(seed, b * ((vocab + 3) // 4) + start // 4 + lanes)
        best, best_index, running_max, running_sum = _accumulate(
            row, start + lanes, vocab, inverse_temperature, bits0, best, best_index, running_max, running_sum
        )
        best, best_index, running_max, running_sum = _accumulate(
            row, start + quarter + lanes, vocab, inverse_temperature, bits1, best, best_index, running_max, running_sum
        )
        best, best_index, running_max, running_sum = _accumulate(
            row,
            start + 2 * quarter + lanes,
            vocab,
            inverse_temperature,
            bits2,
            best,
            best_index,
            running_max,
            running_sum,
        )
        best, best_index, running_max, running_sum = _accumulate(
            row,
            start + 3 * quarter + lanes,
            vocab,
            inverse_temperature,
            bits3,
            best,
            best_index,
            running_max,
            running_sum,
        )
    chunk_best = tl.max(best, axis=0)
    # the first position among the lanes that reach the best (each lane's own is its first)
    chunk_index = tl.min(tl.where(best == chunk_best, best_index, 2147483647), axis=0)
    chunk_max = tl.max(running_max, axis=0)
    shift = tl.where(chunk_max > float("-inf"), chunk_max, 0.0)
    chunk_sum = tl.sum(running_sum * tl.exp2(running_max - shift), axis=0)
    index = b * chunks + chunk
    tl.store(best_ptr + index, chunk_best)
    tl.store(index_ptr + index, chunk_index)
    tl.store(max_ptr + index, chunk_max)  # base 2
    tl.store(sum_ptr + index, chunk_sum)


@triton.jit(do_not_specialize=["chunks"])
def _gumbel_combine(
    logits_ptr,
    stride_b,
    best_ptr,
    index_ptr,
    max_ptr,
    sum_ptr,
    token_ptr,
    logprob_ptr,
    inverse_temperature,
    chunks,
    CHUNKS: tl.constexpr,
):
    b = tl.program_id(0)
    offsets = b * chunks + tl.arange(0, CHUNKS)
    inside = tl.arange(0, CHUNKS) < chunks
    best = tl.load(best_ptr + offsets, mask=inside, other=float("-inf"))
    winner = tl.argmax(best, axis=0)  # the first chunk on ties
    token = tl.load(index_ptr + b * chunks + winner)
    maxima = tl.load(max_ptr + offsets, mask=inside, other=float("-inf"))
    sums = tl.load(sum_ptr + offsets, mask=inside, other=0.0)
    log_partition = merged_log_partition(maxima, sums)
    chosen = tl.load(logits_ptr + b * stride_b + token).to(tl.float32) * inverse_temperature
    tl.store(token_ptr + b, token.to(tl.int64))
    tl.store(logprob_ptr + b, chosen - log_partition)


def gumbel_sample(
    logits: torch.Tensor,
    temperature: float,
    seed: torch.Tensor,
    *,
    chunk_size: int = CHUNK,
    block_size: int = BLOCK,
    num_warps: int = WARPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits: [B, V]` drawn from softmax(logits / T) (T > 0), with uniforms made from
    `seed` (a one-element integer tensor on the logits' device; the same seed gives the same draws), and its
    log-prob log_softmax(logits / T) at the drawn token. Returns `token_ids: [B] long`, `logprobs: [B] float32`.
    `chunk_size` (a multiple of `block_size`, both powers of two, `block_size` at least 64) and `num_warps` are the
    kernel's tuning, for benchmarks; the draws depend on `block_size`, not on `chunk_size`."""
    if temperature <= 0:
        raise ValueError(f"gumbel_sample needs a temperature above 0, got {temperature}")
    batch, vocab = logits.shape
    if batch * (vocab + 3) // 4 >= 2**31:
        raise ValueError(f"gumbel_sample counts its Philox calls in int32: {batch} x {vocab} logits are too many")
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    chunks = triton.cdiv(vocab, chunk_size)
    # three allocations, not thirds of one: Triton specialises a pointer on its 16-byte alignment, and a third's offset
    # (batch x chunks floats) is unaligned for odd batches, a new compilation the first time such a batch comes
    best, maxima, sums = (logits.new_empty((batch, chunks), dtype=torch.float32) for _ in range(3))
    best_index = torch.empty(batch, chunks, dtype=torch.int32, device=logits.device)
    _gumbel_partial[(batch, chunks)](
        logits,
        logits.stride(0),
        seed,
        best,
        best_index,
        maxima,
        sums,
        vocab,
        1.0 / temperature,
        chunks,
        CHUNK_SIZE=chunk_size,
        BLOCK_SIZE=block_size,
        num_warps=num_warps,
    )
    token_ids = torch.empty(batch, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(batch, dtype=torch.float32, device=logits.device)
    _gumbel_combine[(batch,)](
        logits,
        logits.stride(0),
        best,
        best_index,
        maxima,
        sums,
        token_ids,
        logprobs,
        1.0 / temperature,
        chunks,
        CHUNKS=triton.next_power_of_2(chunks),
    )
    return token_ids, logprobs
