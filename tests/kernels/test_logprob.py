"""`kernels.logprob`: log_softmax at one target per row, the logits read once by two Triton kernels.

On a CPU the kernels run in Triton's interpreter (in a subprocess: `TRITON_INTERPRET=1` must be set before Triton
compiles anything), with small chunks so that a row spans several programs, and are compiled for sm90 without a GPU.
The test marked `cuda` runs them through `token_logprobs` on a GPU."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.triton_checks import compile_for_hopper, interpreted

from ragen_lit.kernels import triton_runs_on
from ragen_lit.logprobs import token_logprobs

# run in the subprocess: each case (logits, targets, temperature, chunk_size) through the interpreted kernels
_INTERPRET = """
import sys, torch
from ragen_lit.kernels.logprob import target_logprobs
cases = torch.load(sys.argv[1])
torch.save([target_logprobs(logits, targets, t, chunk_size=c) for logits, targets, t, c in cases], sys.argv[2])
"""


def _want(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, -1).gather(1, targets[:, None])[:, 0]


def test_interpreted_kernels_give_the_log_softmax_at_the_targets(tmp_path):
    """Rows of 1,000 logits in chunks of 128 (a partial last chunk) and of 64 (one chunk each), at T = 1 and 0.7; bf16
    logits read as float32; a run of -inf logits; a target at the row's end; a column slice (rows not contiguous);
    no rows at all."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 1000, generator=generator) * 3
    logits[:, 300:420] = float("-inf")
    targets = torch.randint(0, 300, (9,), generator=generator)
    targets[0] = 999
    narrow = torch.randn(5, 80, generator=generator)[:, 8:72]
    cases = [
        (logits, targets, 1.0, 128),
        (logits, targets, 0.7, 128),
        (logits.bfloat16(), targets, 1.0, 256),
        (narrow, torch.tensor([0, 63, 5, 17, 40]), 1.3, 64),
        (logits[:0], targets[:0], 1.0, 128),
    ]
    out = interpreted(_INTERPRET, cases, tmp_path)
    for got, (case_logits, case_targets, temperature, _) in zip(out, cases, strict=True):
        assert got.dtype == torch.float32 and got.shape == case_targets.shape
        torch.testing.assert_close(got, _want(case_logits, case_targets, temperature), rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_refused():
    from ragen_lit.kernels.logprob import target_logprobs

    with pytest.raises(ValueError, match="temperature above 0"):
        target_logprobs(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), 0.0)
    with pytest.raises(ValueError, match="logits \\[M, V\\] and targets \\[M\\]"):
        target_logprobs(torch.zeros(2, 4), torch.zeros(3, dtype=torch.long))


def test_the_kernels_compile_for_a_hopper_gpu_without_one():
    """Triton's compiler, not its interpreter, down to a cubin for sm90 (no GPU needed)."""
    from ragen_lit.kernels import logprob as kernel

    partial = {"logits_ptr": "*bf16", "stride_m": "i32", "max_ptr": "*fp32", "sum_ptr": "*fp32", "vocab": "i32",
               "scale": "fp32", "chunks": "i32"}  # fmt: skip
    combine = {"logits_ptr": "*bf16", "stride_m": "i32", "target_ptr": "*i64", "max_ptr": "*fp32", "sum_ptr": "*fp32",
               "out_ptr": "*fp32", "inverse_temperature": "fp32", "chunks": "i32"}  # fmt: skip
    assert compile_for_hopper(kernel._partial_log_partition, partial, {"CHUNK_SIZE": kernel.CHUNK}, kernel.WARPS)
    assert compile_for_hopper(kernel._target_logprob, combine, {"CHUNKS": 64}, 4)


def test_scoring_takes_the_kernels_on_cuda_only():
    assert not triton_runs_on(torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_scoring_without_gradients_takes_the_kernels_and_scores_as_the_compiled_head():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = Qwen2ForCausalLM(config).cuda().bfloat16().eval()
    ids = torch.randint(0, 151936, (6, 300), device="cuda")
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[2, 200:] = False
    assert triton_runs_on(ids.device)
    with torch.no_grad():
        got = token_logprobs(model, ids, mask, temperature=0.8, max_tokens_per_chunk=512).logprobs
        want = token_logprobs(model, ids, mask, temperature=0.8, max_tokens_per_chunk=512, with_entropy=True).logprobs
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got[2, 201:].abs().sum() == 0 and got[:, 1:].abs().sum() > 0


class _Launches:
    """Stands in for a Triton kernel: `kernel[grid](*args, **meta)` records the tensor arguments."""

    def __init__(self):
        self.tensors = []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.tensors.extend(a for a in args if torch.is_tensor(a))


def test_every_buffer_the_kernels_take_is_16_byte_aligned_for_odd_row_counts(monkeypatch):
    """Triton specialises a pointer argument on its 16-byte alignment: a buffer at an unaligned offset (the second half
    of one allocation, for an odd number of rows) compiled the kernels again mid-run (~0.1 s on an H200)."""
    from ragen_lit.kernels import logprob as logprob_kernel

    for name in ("_partial_log_partition", "_target_logprob"):
        monkeypatch.setattr(logprob_kernel, name, _Launches())
    logprob_kernel.target_logprobs(torch.zeros(3, 10_000, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.long))
    tensors = logprob_kernel._partial_log_partition.tensors + logprob_kernel._target_logprob.tensors
    assert len(tensors) == 3 + 5 and all(t.data_ptr() % 16 == 0 for t in tensors)
