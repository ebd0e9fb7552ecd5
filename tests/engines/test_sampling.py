"""`engines.sampling`: the truncated, renormalised draw, the Gumbel-max draw against the softmax, temperature and
greedy, the nucleus probe's fallback."""

from __future__ import annotations

import pytest
import torch

from ragen_lit.engines.sampling import sample_next_tokens


def test_sample_next_tokens_draws_from_the_truncated_renormalised_distribution():
    # probs 0.5, 0.25, 0.15, 0.1: top_p 0.7 keeps the 2 most likely (mass before token 3 is 0.75).
    probs = torch.tensor([0.15, 0.5, 0.1, 0.25])
    logits = probs.log().repeat(20000, 1)
    generator = torch.Generator().manual_seed(0)
    token_ids, logprobs = sample_next_tokens(logits, 1.0, 0, 0.7, generator)
    frequencies = torch.bincount(token_ids, minlength=4).double() / len(token_ids)
    assert frequencies.tolist() == pytest.approx([0.0, 2 / 3, 0.0, 1 / 3], abs=0.02)
    # Log-probs are reported before truncation.
    assert torch.allclose(logprobs, probs.log()[token_ids])

    token_ids, _ = sample_next_tokens(logits, 1.0, 3, 1.0, generator)
    frequencies = torch.bincount(token_ids, minlength=4).double() / len(token_ids)
    assert frequencies.tolist() == pytest.approx([0.15 / 0.9, 0.5 / 0.9, 0.0, 0.25 / 0.9], abs=0.02)

    # top_k 3 renormalises to 0.556, 0.278, 0.167; top_p 0.8 keeps the first two.
    token_ids, _ = sample_next_tokens(logits, 1.0, 3, 0.8, generator)
    frequencies = torch.bincount(token_ids, minlength=4).double() / len(token_ids)
    assert frequencies.tolist() == pytest.approx([0.0, 2 / 3, 0.0, 1 / 3], abs=0.02)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_gumbel_max_draw_samples_the_softmax_and_reports_its_log_prob(temperature):
    """`full_vocabulary="gumbel"` (V uniforms drawn into a tensor): the same distribution as the inverse-CDF draw.
    CUDA's default, the same draw with its uniforms made inside Triton kernels: tests/kernels/test_gumbel.py."""
    logits = torch.tensor([0.15, 0.5, 0.1, 0.25]).log().repeat(40000, 1)
    probs = torch.softmax(logits[0] / temperature, -1)
    token_ids, logprobs = sample_next_tokens(
        logits, temperature, 0, 1.0, torch.Generator().manual_seed(0), full_vocabulary="gumbel"
    )
    frequencies = torch.bincount(token_ids, minlength=4).double() / len(token_ids)
    assert frequencies.tolist() == pytest.approx(probs.tolist(), abs=0.01)
    torch.testing.assert_close(logprobs, torch.log_softmax(logits / temperature, -1)[0][token_ids])
    again, _ = sample_next_tokens(
        logits, temperature, 0, 1.0, torch.Generator().manual_seed(0), full_vocabulary="gumbel"
    )
    assert torch.equal(again, token_ids)  # a seeded generator gives the same draws
    inverse, _ = sample_next_tokens(
        logits, temperature, 0, 1.0, torch.Generator().manual_seed(0), full_vocabulary="inverse_cdf"
    )
    assert not torch.equal(inverse, token_ids)  # the other method: other draws of the same distribution
    assert torch.equal(sample_next_tokens(logits, temperature, 0, 1.0, torch.Generator().manual_seed(0))[0], inverse)


def test_sample_next_tokens_temperature_scales_logprobs_and_zero_is_argmax():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, -1.0, 0.0]])
    token_ids, logprobs = sample_next_tokens(logits, 0.0, 0, 1.0, None)
    assert token_ids.tolist() == [1, 0]
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])
    token_ids, logprobs = sample_next_tokens(logits, 0.5, 0, 1.0, torch.Generator().manual_seed(0))
    assert torch.allclose(logprobs, torch.log_softmax(logits / 0.5, -1).gather(-1, token_ids[:, None])[:, 0])


def test_sample_next_tokens_nucleus_beyond_the_probe_falls_back_to_a_full_sort():
    # A flat 1000-token distribution: the nucleus for top_p 0.5 is 500 tokens, more than the probe.
    logits = torch.zeros(4000, 1000)
    token_ids, _ = sample_next_tokens(logits, 1.0, 0, 0.5, torch.Generator().manual_seed(0))
    assert len(set(token_ids.tolist())) > 300
