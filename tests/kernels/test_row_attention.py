"""`kernels.row_attention`: the scorer's packed rows over their prompt's prefix and their own earlier tokens, in
one Triton kernel.

On a CPU the kernel runs in Triton's interpreter (in a subprocess: `TRITON_INTERPRET=1` must be set before Triton
compiles anything) with 16-wide tiles, so that prefixes and rows span several key and query blocks, against the path
it replaces (`varlen_attention` over the prefixes and over each row's own tokens, then `merge_attention`); it is also
compiled for sm90 without a GPU. The test marked `cuda` runs it against FlashAttention and the merge in bf16."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.triton_checks import compile_for_hopper, interpreted

from ragen_lit.kernels.varlen_attention import merge_attention, varlen_attention

# run in the subprocess: each case through the interpreted kernel
_INTERPRET = """
import sys, torch
from ragen_lit.kernels.row_attention import rows_over_prefix
cases = torch.load(sys.argv[1])
torch.save([rows_over_prefix(*case, block_q=16, block_k=16) for case in cases], sys.argv[2])
"""


def _case(prefixes: list[int], rows: list[list[int]], heads: int, kv_heads: int, dim: int, seed: int, dtype=None):
    """Prompts with prefixes of `prefixes` tokens, prompt j's rows of `rows[j]` tokens packed end to end, random
    queries, keys and values; `rows_over_prefix`'s arguments."""
    generator = torch.Generator().manual_seed(seed)
    cu_queries, cu_prefix, starts, token = [0], [0], [], 0
    for prefix, lengths in zip(prefixes, rows, strict=True):
        for length in lengths:
            starts += [token] * length
            token += length
        cu_queries.append(token)
        cu_prefix.append(cu_prefix[-1] + prefix)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype or torch.float32)

    def ints(values):
        return torch.tensor(values, dtype=torch.int32)

    q, k, v = randn(token, heads, dim), randn(token, kv_heads, dim), randn(token, kv_heads, dim)
    prefix_k, prefix_v = randn(cu_prefix[-1], kv_heads, dim), randn(cu_prefix[-1], kv_heads, dim)
    max_queries = max(b - a for a, b in zip(cu_queries, cu_queries[1:]))
    return q, k, v, prefix_k, prefix_v, ints(cu_queries), ints(cu_prefix), ints(starts), max_queries, dim**-0.5


def _reference(q, k, v, prefix_k, prefix_v, cu_queries, cu_prefix, starts, max_queries, scale):
    """The two-pass path: every row over its own tokens, merged per prompt with the attention over its prefix."""
    device = starts.device
    cu_rows = torch.unique(torch.cat([starts, torch.tensor([q.shape[0]], dtype=torch.int32, device=device)])).int()
    longest = int(cu_rows.diff().max())
    out, lse = varlen_attention(q, k, v, cu_rows, cu_rows, longest, longest, causal=True, scale=scale)
    merged = out.clone()
    for j in range(cu_queries.numel() - 1):
        q0, q1, p0, p1 = (int(x) for x in (cu_queries[j], cu_queries[j + 1], cu_prefix[j], cu_prefix[j + 1]))
        if q1 == q0 or p1 == p0:
            continue
        queries = torch.tensor([0, q1 - q0], dtype=torch.int32, device=device)
        keys = torch.tensor([0, p1 - p0], dtype=torch.int32, device=device)
        prefix_out, prefix_lse = varlen_attention(
            q[q0:q1], prefix_k[p0:p1], prefix_v[p0:p1], queries, keys, q1 - q0, p1 - p0, causal=False, scale=scale
        )
        merged[q0:q1] = merge_attention(out[q0:q1], lse[:, q0:q1], prefix_out, prefix_lse)
    return merged


def test_interpreted_kernel_attends_over_the_prefix_and_the_own_row(tmp_path):
    """Prefixes of 0 to 48 tokens (several 16-wide key blocks, some ending on a block's end), rows of 1 to 70 tokens
    (query blocks that span several rows, rows that span several blocks), a prompt without rows, grouped-query heads
    (4 over 2, and 3 over 1), head sizes 16 and 32; and a query slice whose heads are not contiguous rows of memory."""
    cases = [
        _case([23, 0, 40, 5, 17], [[3, 17, 1], [5], [33, 2, 16, 9], [], [70, 1]], heads=4, kv_heads=2, dim=16, seed=0),
        _case([9, 32, 48], [[40, 3, 1], [12], [5]], heads=3, kv_heads=1, dim=32, seed=1),  # prefixes of whole blocks
    ]
    q, *rest = _case([20, 7], [[9, 20], [4]], heads=4, kv_heads=2, dim=16, seed=2)
    wide = torch.randn(q.shape[0], 6, 16)
    wide[:, 1:5] = q
    cases.append((wide[:, 1:5], *rest))
    out = interpreted(_INTERPRET, cases, tmp_path)
    for got, case in zip(out, cases, strict=True):
        want = _reference(*case)
        assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_kernel_compiles_for_a_hopper_gpu_without_one():
    """Triton's compiler, not its interpreter, down to a cubin for sm90 (no GPU needed), at the scorer's tiles."""
    from ragen_lit.kernels import row_attention as kernel

    pointers = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "pk_ptr", "pv_ptr", "out_ptr"), "*bf16")
    offsets = dict.fromkeys(("cu_q_ptr", "cu_p_ptr", "starts_ptr"), "*i32")
    strides = dict.fromkeys(
        ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_pkt", "stride_pkh",
         "stride_pvt", "stride_pvh", "stride_ot", "stride_oh", "groups"), "i32")  # fmt: skip
    signature = {**pointers, **offsets, **strides, "scale": "fp32"}
    for head_dim in (64, 128):
        tiles = {"HEAD_DIM": head_dim, "BLOCK_Q": kernel.BLOCK_Q, "BLOCK_K": kernel.BLOCK_K}
        assert compile_for_hopper(kernel._rows_over_prefix, signature, tiles, 4)


def test_the_kernel_takes_cuda_half_precision_and_power_of_two_heads_only():
    from ragen_lit.kernels.row_attention import runs_on

    assert not runs_on(torch.zeros(2, 4, 64, dtype=torch.bfloat16))  # a CPU
    meta = torch.zeros(2, 4, 64, dtype=torch.bfloat16, device="meta")
    assert not runs_on(meta)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_kernel_scores_what_flash_attention_and_the_merge_do_in_bf16():
    from ragen_lit.kernels.row_attention import rows_over_prefix, runs_on

    rows = [[1, 7, 64, 65], [130, 101], [], [3]]
    case = _case([300, 129, 64, 0], rows, heads=14, kv_heads=2, dim=64, seed=3, dtype=torch.bfloat16)
    case = tuple(t.cuda() if torch.is_tensor(t) else t for t in case)
    assert runs_on(case[0])
    got = rows_over_prefix(*case)
    torch.testing.assert_close(got.float(), _reference(*case).float(), rtol=2e-2, atol=2e-2)
