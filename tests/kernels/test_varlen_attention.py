"""`kernels.varlen_attention`: the log-sum-exp merge on a hand-computed case, the variable-length attention against
per-segment sdpa (CPU), FlashAttention's kernel against the segment-by-segment path (CUDA)."""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lit.kernels.varlen_attention import (
    UnsupportedAttention,
    _segment_by_segment,
    compiled_merge,
    merge_attention,
    varlen_attention,
)


def test_merge_of_two_key_sets_is_the_attention_over_their_union_by_hand():
    """One query, one head. Part a: scores 0 and ln 3 over values v1, v2, so λ_a = ln 4 and o_a = (v1 + 3 v2) / 4.
    Part b: score ln 4 over v3, so λ_b = ln 4 and o_b = v3. Over all three keys the weights are 1, 3 and 4 of 8:
    o = (v1 + 3 v2 + 4 v3) / 8, which is o_a / 2 + o_b / 2."""
    v1, v2, v3 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([2.0, 2.0])
    out_a, lse_a = ((v1 + 3 * v2) / 4)[None, None], torch.tensor([[math.log(4)]])
    out_b, lse_b = v3[None, None], torch.tensor([[math.log(4)]])
    merged = merge_attention(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(merged[0, 0], (v1 + 3 * v2 + 4 * v3) / 8)
    torch.testing.assert_close(merged[0, 0], torch.tensor([1.125, 1.375]))


def test_merge_equals_sdpa_over_the_concatenated_keys():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 3, 5, 8), torch.randn(1, 3, 11, 8), torch.randn(1, 3, 11, 8)
    parts = []
    for keys, values in ((k[:, :, :4], v[:, :, :4]), (k[:, :, 4:], v[:, :, 4:])):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, keys, values, 0.0, False)
        parts += [out[0].transpose(0, 1), lse[0]]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1)
    torch.testing.assert_close(merge_attention(*parts), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_merge_is_the_merge(dtype):
    """CUDA runs `merge_attention` compiled (one fused kernel); the same function, the same numbers."""
    torch.manual_seed(3)
    out_a, out_b = torch.randn(7, 3, 8, dtype=dtype), torch.randn(7, 3, 8, dtype=dtype)
    lse_a, lse_b = torch.randn(3, 7) * 3, torch.randn(3, 7) * 3
    want = merge_attention(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(compiled_merge()(out_a, lse_a, out_b, lse_b), want, atol=1e-6, rtol=1e-6)


def _segments_reference(query, key, value, cu_q, cu_k, causal, scale):
    """Per segment: sdpa over the key heads repeated per query head, and the log partition sums by hand."""
    groups = query.shape[1] // key.shape[1]
    out, lse = torch.zeros_like(query), torch.zeros(query.shape[1], query.shape[0])
    for s in range(len(cu_q) - 1):
        if cu_q[s + 1] == cu_q[s]:
            continue
        q = query[cu_q[s] : cu_q[s + 1]].transpose(0, 1).float()
        k = key[cu_k[s] : cu_k[s + 1]].repeat_interleave(groups, 1).transpose(0, 1).float()
        v = value[cu_k[s] : cu_k[s + 1]].repeat_interleave(groups, 1).transpose(0, 1).float()
        scores = q @ k.transpose(-1, -2) * scale
        if causal:
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        out[cu_q[s] : cu_q[s + 1]] = (scores.softmax(-1) @ v).transpose(0, 1).to(query.dtype)
        lse[:, cu_q[s] : cu_q[s + 1]] = scores.logsumexp(-1)
    return out, lse


# three segments: 4 queries over 6 keys, none over 3 keys (a prompt without rows in the batch), 5 over 2
CROSS = ([0, 4, 4, 9], [0, 6, 9, 11])
SELF = ([0, 3, 4, 9], [0, 3, 4, 9])  # rows of 3, 1 and 5 tokens


@pytest.mark.parametrize("causal, offsets", [(True, SELF), (False, CROSS)], ids=["own-rows", "prefixes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_attention_equals_attention_segment_by_segment(causal, offsets, dtype):
    torch.manual_seed(1)
    cu_q, cu_k = offsets
    query = torch.randn(cu_q[-1], 6, 16, dtype=dtype)  # 6 query heads over 2 key/value heads
    key, value = torch.randn(cu_k[-1], 2, 16, dtype=dtype), torch.randn(cu_k[-1], 2, 16, dtype=dtype)
    lengths_q, lengths_k = torch.tensor(cu_q).diff(), torch.tensor(cu_k).diff()
    out, lse = varlen_attention(
        query,
        key,
        value,
        torch.tensor(cu_q, dtype=torch.int32),
        torch.tensor(cu_k, dtype=torch.int32),
        int(lengths_q.max()),
        int(lengths_k.max()),
        causal=causal,
        scale=0.3,
    )
    want_out, want_lse = _segments_reference(query, key, value, cu_q, cu_k, causal, 0.3)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (6, cu_q[-1])
    torch.testing.assert_close(out, want_out, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(lse, want_lse, atol=tolerance, rtol=tolerance)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's variable-length kernel needs CUDA")
@pytest.mark.parametrize("causal, offsets", [(True, SELF), (False, CROSS)], ids=["own-rows", "prefixes"])
def test_flash_varlen_on_cuda_equals_the_segment_by_segment_math(causal, offsets):
    torch.manual_seed(2)
    cu_q, cu_k = offsets
    device = torch.device("cuda")
    query = torch.randn(cu_q[-1], 14, 64, dtype=torch.bfloat16, device=device)
    key = torch.randn(cu_k[-1], 2, 64, dtype=torch.bfloat16, device=device)
    value = torch.randn(cu_k[-1], 2, 64, dtype=torch.bfloat16, device=device)
    args = [torch.tensor(cu, dtype=torch.int32, device=device) for cu in (cu_q, cu_k)]
    lengths = [int(torch.tensor(cu).diff().max()) for cu in (cu_q, cu_k)]
    out, lse = varlen_attention(query, key, value, *args, *lengths, causal=causal, scale=0.125)
    on_cpu = [t.cpu().float() for t in (query, key, value)]
    want_out, want_lse = _segment_by_segment(*on_cpu, cu_q, cu_k, causal=causal, scale=0.125)
    assert out.dtype == torch.bfloat16 and lse.shape == (14, cu_q[-1])
    torch.testing.assert_close(out.cpu().float(), want_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-3, rtol=1e-3)


def test_without_a_kernel_that_returns_partition_sums_the_attention_is_refused():
    """fp32 on CUDA (or a GPU before compute capability 8.0, or another device): `UnsupportedAttention`, which sends
    the scorer to its masked path, instead of a slow or failing kernel. The meta device stands in for such a device."""
    query, key = torch.empty(5, 4, 8, device="meta"), torch.empty(5, 2, 8, device="meta")
    offsets = torch.tensor([0, 5], dtype=torch.int32, device="meta")
    with pytest.raises(UnsupportedAttention, match="no variable-length kernel for torch.float32"):
        varlen_attention(query, key, key, offsets, offsets, 5, 5, causal=True, scale=1.0)
