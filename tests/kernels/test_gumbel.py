"""`kernels.gumbel`: the Gumbel-max draw whose Triton kernels make their own uniforms.

On a CPU the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, set before Triton compiles anything, so in a
subprocess), with small chunks and blocks so that a row spans several programs and a chunk several blocks. The tests
marked `cuda` run the compiled kernels on the engine's shape."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.triton_checks import compile_for_hopper
from tests.kernels.triton_checks import interpreted as run_interpreted

from ragen_lit.engines.sampling import sample_next_tokens

# run in the subprocess: each case (logits, temperature, seed, chunk_size, block_size) through the interpreted kernels
_INTERPRET = """
import sys, torch
from ragen_lit.kernels.gumbel import gumbel_sample
from ragen_lit.engines.sampling import sample_next_tokens
cases, draws = torch.load(sys.argv[1])
out = [gumbel_sample(logits, t, torch.tensor([seed]), chunk_size=c, block_size=b) for logits, t, seed, c, b in cases]
# through the engine's sampler: a seeded generator's draw of the seed
out += [sample_next_tokens(logits, t, 0, 1.0, torch.Generator().manual_seed(s), full_vocabulary="philox")
        for logits, t, s in draws]
torch.save(out, sys.argv[2])
"""


def interpreted(cases, tmp_path, draws=()):
    """`gumbel_sample` on each case, then `sample_next_tokens(full_vocabulary="philox")` on each draw, interpreted."""
    return run_interpreted(_INTERPRET, (cases, list(draws)), tmp_path)


@pytest.mark.slow
def test_interpreted_draws_follow_the_softmax_at_every_temperature(tmp_path):
    """Frequencies of 1,200 draws against softmax(x / T) (chi-square below its 0.1% quantile), and the reported
    log-probs against log_softmax at the drawn tokens, for T = 1 and 0.5."""
    base = torch.tensor([0.15, 0.5, 0.1, 0.25]).log()
    logits = base.repeat(1200, 1)
    out = interpreted([(logits, 1.0, 7, 64, 64), (logits, 0.5, 8, 64, 64)], tmp_path)
    for (tokens, logprobs), temperature in zip(out, (1.0, 0.5), strict=True):
        probs = torch.softmax(base / temperature, -1).double()
        counts = torch.bincount(tokens, minlength=4).double()
        expected = probs * len(tokens)
        assert ((counts - expected) ** 2 / expected).sum() < 16.27  # chi-square, 3 degrees of freedom, p = 0.001
        torch.testing.assert_close(logprobs, torch.log_softmax(logits / temperature, -1)[0][tokens])


@pytest.mark.slow
def test_interpreted_rows_spanning_chunks_give_the_full_log_sum_exp_and_the_best_chunk(tmp_path):
    """1,000 logits in chunks of 128 and blocks of 64 (a partial last block): each log-prob is log_softmax over the
    whole row; a logit far above the rest is always drawn, wherever it lies (first, in a middle chunk, last);
    -inf logits are never drawn."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 1000, generator=generator) * 2
    logits[:, 500:600] = float("-inf")
    logits[0, 0] = logits[1, 500] = logits[2, 999] = 60.0  # row 1's inside the -inf run
    out = interpreted([(logits, 1.0, 3, 128, 64), (logits, 0.7, 3, 128, 64)], tmp_path)
    for (tokens, logprobs), temperature in zip(out, (1.0, 0.7), strict=True):
        assert tokens[:3].tolist() == [0, 500, 999]
        assert not ((tokens[3:] >= 500) & (tokens[3:] < 600)).any()
        want = torch.log_softmax(logits / temperature, -1).gather(1, tokens[:, None])[:, 0]
        torch.testing.assert_close(logprobs, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_interpreted_draws_depend_on_the_seed_and_not_on_the_chunking(tmp_path):
    logits = torch.zeros(64, 300)  # uniform: every draw is the noise's argmax
    first, again, other_chunks, other_seed, engine, engine_again = interpreted(
        [(logits, 1.0, 5, 64, 64), (logits, 1.0, 5, 64, 64), (logits, 1.0, 5, 256, 64), (logits, 1.0, 6, 64, 64)],
        tmp_path,
        draws=[(logits, 1.0, 11), (logits, 1.0, 11)],
    )
    assert torch.equal(first[0], again[0]) and torch.equal(first[0], other_chunks[0])
    assert not torch.equal(first[0], other_seed[0])
    assert first[0].unique().numel() > 40  # 64 uniform draws over 300 tokens: not one repeated token
    assert torch.equal(engine[0], engine_again[0])  # a seeded generator's seed: the same draws


def test_the_default_draw_is_the_kernel_on_cuda_with_triton_and_the_tensor_gumbel_without(monkeypatch):
    import importlib.util

    from ragen_lit.engines.sampling import default_full_vocabulary_draw

    assert default_full_vocabulary_draw(is_cuda=False) == "inverse_cdf"
    assert default_full_vocabulary_draw(is_cuda=True) == "philox"  # this environment installs Triton
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "triton" else find_spec(name))
    assert default_full_vocabulary_draw(is_cuda=True) == "gumbel"


def test_bad_temperature_and_unknown_draw_are_refused():
    from ragen_lit.kernels.gumbel import gumbel_sample

    with pytest.raises(ValueError, match="temperature above 0"):
        gumbel_sample(torch.zeros(2, 8), 0.0, torch.tensor([1]))
    with pytest.raises(ValueError, match="full_vocabulary must be None or one of"):
        sample_next_tokens(torch.zeros(2, 8), 1.0, 0, 1.0, None, full_vocabulary="multinomial")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_default_draw_is_the_kernel_and_follows_the_softmax():
    """The engine's sampler on CUDA (bf16 logits of the bench's vocabulary): frequencies of a 4-token distribution
    hidden in 151,936 logits, log-probs against log_softmax, and a seeded generator's reproducibility."""
    base = torch.full((151936,), -1e4)
    base[[3, 70000, 100000, 151935]] = torch.tensor([0.15, 0.5, 0.1, 0.25]).log()
    logits = base.repeat(4096, 1).cuda().bfloat16()
    tokens, logprobs = sample_next_tokens(logits, 1.0, 0, 1.0, torch.Generator("cuda").manual_seed(0))
    again, _ = sample_next_tokens(logits, 1.0, 0, 1.0, torch.Generator("cuda").manual_seed(0))
    assert torch.equal(tokens, again)
    counts = torch.stack([(tokens == i).sum() for i in (3, 70000, 100000, 151935)]).double().cpu()
    assert counts.sum() == len(tokens)
    expected = torch.tensor([0.15, 0.5, 0.1, 0.25]).double() * len(tokens)
    assert ((counts - expected) ** 2 / expected).sum() < 16.27
    want = torch.log_softmax(logits.float(), -1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(logprobs, want, rtol=1e-4, atol=1e-4)


def test_the_kernels_compile_for_a_hopper_gpu_without_one():
    """Triton's compiler, not its interpreter, down to a cubin for sm90 (no GPU needed)."""
    from ragen_lit.kernels import gumbel as gumbel_kernel

    pointers = {"logits_ptr": "*bf16", "best_ptr": "*fp32", "index_ptr": "*i32", "max_ptr": "*fp32", "sum_ptr": "*fp32"}
    partial = {**pointers, "stride_b": "i32", "seed_ptr": "*i64", "vocab": "i32", "inverse_temperature": "fp32",
               "chunks": "i32"}  # fmt: skip
    combine = {**pointers, "stride_b": "i32", "token_ptr": "*i64", "logprob_ptr": "*fp32",
               "inverse_temperature": "fp32", "chunks": "i32"}  # fmt: skip
    tiles = {"CHUNK_SIZE": gumbel_kernel.CHUNK, "BLOCK_SIZE": gumbel_kernel.BLOCK}
    assert compile_for_hopper(gumbel_kernel._gumbel_partial, partial, tiles, gumbel_kernel.WARPS)
    assert compile_for_hopper(gumbel_kernel._gumbel_combine, combine, {"CHUNKS": 64}, 4)


def test_every_buffer_the_kernels_take_is_16_byte_aligned_for_odd_batches(monkeypatch):
    """Triton specialises a pointer argument on its 16-byte alignment: buffers at unaligned offsets (thirds of one
    allocation, for an odd batch) would compile the kernels again the first time such a batch comes."""
    from ragen_lit.kernels import gumbel as gumbel_kernel

    seen = []

    class Launches:
        def __getitem__(self, grid):
            return lambda *args, **meta: seen.extend(a for a in args if torch.is_tensor(a))

    for name in ("_gumbel_partial", "_gumbel_combine"):
        monkeypatch.setattr(gumbel_kernel, name, Launches())
    gumbel_kernel.gumbel_sample(torch.zeros(3, 10_000), 1.0, torch.zeros(1, dtype=torch.long))
    assert len(seen) == 6 + 7 and all(t.data_ptr() % 16 == 0 for t in seen)
