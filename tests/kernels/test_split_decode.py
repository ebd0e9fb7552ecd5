"""`kernels.split_decode`: the flash-decoding Triton kernels equal sdpa over repeated keys and values, and never read
the keys and values of a block the mask hides.

On a CPU the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, set before Triton compiles anything, so in a
subprocess), in float32: the interpreter's bfloat16 matrix product is wrong. The tests marked `cuda` run the
compiled kernels in bfloat16, inside a model's decode step and the engine's captured graphs."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.triton_checks import compile_for_hopper
from tests.kernels.triton_checks import interpreted as run_interpreted

# the kernels' split and block sizes (`kernels.split_decode.SPLIT`, `BLOCK`, checked below): that module imports
# Triton, which only the main test environment installs, and every environment collects this file
SPLIT, BLOCK = 128, 64
MIN = torch.finfo(torch.float32).min

# run in the subprocess: the inputs saved by the test, each case through the interpreted kernels
_INTERPRET = """
import sys, torch
from ragen_lit.kernels.split_decode import split_decode
cases = torch.load(sys.argv[1])
torch.save([split_decode(*case) for case in cases], sys.argv[2])
"""


def interpreted(cases, tmp_path):
    """`split_decode(*case)` for each case, in Triton's interpreter."""
    return run_interpreted(_INTERPRET, cases, tmp_path)


def repeated(query, key, value, bias, scale):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=bias[:, None, None, :].float(), scale=scale
    ).to(query.dtype)


def case(batch, heads, kv_heads, length, dtype=torch.float32, seed=0, dim=64):
    """Queries, keys, values and a bias with every pattern the decode slots make: left padding, masked runs inside
    (kept turns' padding and stopped steps), whole masked blocks and splits, and an unused end of the bucket."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, 1, dim, generator=generator, dtype=dtype)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=dtype)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=dtype)
    keep = torch.rand(batch, length, generator=generator) < 0.7
    keep[:, 0] = True
    keep[0, 3 * BLOCK : 5 * BLOCK + 7] = False  # two whole blocks and a bit
    keep[-1, : SPLIT + BLOCK] = False  # a whole split of left padding
    keep[:, length - 40 :] = False  # the columns after the current step
    keep[:, length - 41] = True  # the current step's column, which every row attends
    bias = torch.zeros(batch, length, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    return query, key, value, bias, 0.125


@pytest.mark.slow
@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "length"),
    [(3, 14, 2, 3 * SPLIT), (2, 6, 2, SPLIT + 100), (2, 2, 2, 2 * BLOCK + SPLIT), (1, 32, 4, 2 * SPLIT)],
    ids=["G7-3splits", "G3-partial-split", "G1", "G8"],
)
def test_interpreted_kernels_equal_sdpa_over_repeated_keys(tmp_path, batch, heads, kv_heads, length):
    cases = [case(batch, heads, kv_heads, length)]
    # a bias broadcast over the rows (stride 0), and a one-row batch
    query, key, value, bias, scale = case(batch, heads, kv_heads, length, seed=1)
    cases.append((query, key, value, bias[:1].expand(batch, -1), scale))
    cases.append(tuple(t[:1] if isinstance(t, torch.Tensor) else t for t in cases[0]))
    cases.append(case(batch, heads, kv_heads, length, dim=8))  # under the matrix products' 16: padded
    for got, inputs in zip(interpreted(cases, tmp_path), cases, strict=True):
        assert got.shape == inputs[0].shape and got.dtype == inputs[0].dtype
        torch.testing.assert_close(got, repeated(*inputs), atol=2e-5, rtol=1e-4)


def test_the_kernels_compile_for_a_hopper_gpu_without_one():
    """Triton's compiler, not its interpreter, down to a cubin for sm90 (no GPU needed), at the bench's shape (7
    query heads per key/value head of 64) in bf16."""
    from ragen_lit.kernels import split_decode

    partial = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "bias_ptr")}
    partial |= {"out_ptr": "*fp32", "lse_ptr": "*fp32"}
    partial |= dict.fromkeys(
        ["q_stride_b", "q_stride_h", "k_stride_b", "k_stride_h", "k_stride_s", "v_stride_b", "v_stride_h",
         "v_stride_s", "bias_stride_b", "bias_stride_s", "length", "splits"], "i32",
    )  # fmt: skip
    partial["scale"] = "fp32"
    constants = {"GROUPS": 7, "ROWS": 16, "DIM": 64, "DIM_PAD": 64, "SPLIT_SIZE": SPLIT, "BLOCK_SIZE": BLOCK,
                 "MASKED_AT": split_decode.MASKED, "PRECISION": "tf32"}  # fmt: skip
    assert compile_for_hopper(split_decode._flash_decode_partial, partial, constants, split_decode.WARPS)
    combine = {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": "*bf16", "out_stride_b": "i32",
               "out_stride_h": "i32", "heads": "i32", "splits": "i32"}  # fmt: skip
    assert compile_for_hopper(split_decode._flash_decode_combine, combine, {"SPLITS": 16, "DIM": 64, "DIM_PAD": 64}, 4)


def test_the_cases_cover_the_kernels_blocks_and_splits():
    from ragen_lit.kernels import split_decode

    assert (split_decode.SPLIT, split_decode.BLOCK) == (SPLIT, BLOCK)


def test_masked_blocks_are_never_read_and_masked_positions_get_no_weight(tmp_path):
    query, key, value, bias, scale = case(2, 14, 2, 3 * SPLIT)
    key_poisoned, value_poisoned = key.clone(), value.clone()
    # row 0's whole masked blocks hold NaN: a kernel that read them would return NaN
    key_poisoned[0, :, 3 * BLOCK : 5 * BLOCK] = float("nan")
    value_poisoned[0, :, 3 * BLOCK : 5 * BLOCK] = float("nan")
    # masked positions inside attended blocks hold huge values: any weight on them would show
    hidden = (bias[1] == MIN).nonzero()[:, 0]
    value_poisoned[1, :, hidden] = 1e6
    # a row that attends nowhere gets zeros (the decode slots always leave one position)
    nowhere = bias.clone()
    nowhere[1] = MIN
    got, want, empty = interpreted(
        [(query, key_poisoned, value_poisoned, bias, scale), (query, key, value, bias, scale),
         (query, key, value, nowhere, scale)],
        tmp_path,
    )  # fmt: skip
    torch.testing.assert_close(got, want)
    assert not got.isnan().any()
    assert empty[1].eq(0).all()
    torch.testing.assert_close(empty[0], want[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled Triton kernels need CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_compiled_kernels_on_cuda_equal_sdpa_over_repeated_keys(dtype):
    for shape in [(128, 14, 2, 2048), (3, 6, 2, SPLIT + 100), (8, 16, 8, 512)]:
        inputs = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in case(*shape, dtype=dtype))
        from ragen_lit.kernels.split_decode import split_decode

        tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype != torch.float32 else {"atol": 2e-3, "rtol": 2e-3}
        torch.testing.assert_close(split_decode(*inputs), repeated(*inputs), **tolerance)
