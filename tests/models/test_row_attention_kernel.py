"""`models.row_attention_kernel`: the scorer's rows over their own tokens, merged with their prefix attention, in one
Triton kernel.

On a CPU the kernel runs in Triton's interpreter (in a subprocess: `TRITON_INTERPRET=1` must be set before Triton
compiles anything) with 16-wide tiles, so that rows span several query and key blocks, against the path it replaces
(`varlen_attention` segment by segment, then `merge_attention`); it is also compiled for sm90 without a GPU. The test
marked `cuda` runs it against FlashAttention and the compiled merge in bf16."""

from __future__ import annotations

import pytest
import torch
from tests.models.triton_checks import compile_for_hopper, interpreted

from ragen_lit.models.prefix_attention import merge_attention, varlen_attention

# run in the subprocess: each case through the interpreted kernel
_INTERPRET = """
import sys, torch
from ragen_lit.models.row_attention_kernel import rows_attention_merged
cases = torch.load(sys.argv[1])
torch.save([rows_attention_merged(*case, block_q=16, block_k=16) for case in cases], sys.argv[2])
"""


def _case(lengths: list[int], heads: int, kv_heads: int, dim: int, seed: int, dtype=torch.float32):
    """Packed rows of `lengths` with random queries, keys and values, and a random prefix attention (out, lse)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    q = torch.randn(tokens, heads, dim, generator=generator).to(dtype)
    k = torch.randn(tokens, kv_heads, dim, generator=generator).to(dtype)
    v = torch.randn(tokens, kv_heads, dim, generator=generator).to(dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    prefix_out = torch.randn(tokens, heads, dim, generator=generator).to(dtype)
    prefix_lse = torch.randn(heads, tokens, generator=generator) * 3  # some rows dominated by either side
    return q, k, v, cu, max(lengths), prefix_out, prefix_lse, dim**-0.5


def _reference(q, k, v, cu, max_row, prefix_out, prefix_lse, scale):
    out, lse = varlen_attention(q, k, v, cu, cu, max_row, max_row, causal=True, scale=scale)
    return merge_attention(out, lse, prefix_out, prefix_lse)


def test_interpreted_kernel_gives_the_own_attention_merged_with_the_prefix(tmp_path):
    """Rows of 1 to 70 tokens (several 16-wide query and key blocks), grouped-query heads (4 over 2, and 3 over 1),
    head sizes 16 and 32; and a query slice whose heads are not contiguous rows of memory."""
    cases = [
        _case([1, 5, 17, 33, 70, 16], heads=4, kv_heads=2, dim=16, seed=0),
        _case([40, 3, 1], heads=3, kv_heads=1, dim=32, seed=1),
    ]
    q, k, v, cu, max_row, prefix_out, prefix_lse, scale = _case([9, 20], heads=4, kv_heads=2, dim=16, seed=2)
    wide = torch.randn(q.shape[0], 6, 16)
    wide[:, 1:5] = q
    cases.append((wide[:, 1:5], k, v, cu, max_row, prefix_out, prefix_lse, scale))
    out = interpreted(_INTERPRET, cases, tmp_path)
    for got, case in zip(out, cases, strict=True):
        want = _reference(*case)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_kernel_compiles_for_a_hopper_gpu_without_one():
    """Triton's compiler, not its interpreter, down to a cubin for sm90 (no GPU needed), at the scorer's tiles."""
    from ragen_lit.models import row_attention_kernel as kernel

    pointers = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "prefix_out_ptr", "out_ptr"), "*bf16")
    strides = dict.fromkeys(
        ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_pt", "stride_ph",
         "stride_lh", "stride_ot", "stride_oh", "groups"), "i32")  # fmt: skip
    signature = {**pointers, "cu_ptr": "*i32", "prefix_lse_ptr": "*fp32", **strides, "scale": "fp32"}
    for head_dim in (64, 128):
        tiles = {"HEAD_DIM": head_dim, "BLOCK_Q": kernel.BLOCK_M, "BLOCK_K": kernel.BLOCK_N}
        assert compile_for_hopper(kernel._rows_merged, signature, tiles, 4)


def test_the_kernel_takes_cuda_half_precision_and_power_of_two_heads_only():
    from ragen_lit.models.row_attention_kernel import runs_on

    assert not runs_on(torch.zeros(2, 4, 64, dtype=torch.bfloat16))  # a CPU
    meta = torch.zeros(2, 4, 64, dtype=torch.bfloat16, device="meta")
    assert not runs_on(meta)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_kernel_scores_what_flash_attention_and_the_merge_do_in_bf16():
    from ragen_lit.models.row_attention_kernel import rows_attention_merged, runs_on

    case = _case([1, 7, 64, 65, 130, 101], heads=14, kv_heads=2, dim=64, seed=3, dtype=torch.bfloat16)
    case = tuple(t.cuda() if torch.is_tensor(t) else t for t in case)
    assert runs_on(case[0])
    got = rows_attention_merged(*case)
    torch.testing.assert_close(got.float(), _reference(*case).float(), rtol=2e-2, atol=2e-2)
