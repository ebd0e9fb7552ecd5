"""One token per row from a batch of next-token logits, and its log-prob: the engine's three samplers.

`sample_next_tokens` applies temperature, top-k and top-p and draws from what is left. A draw over the whole
vocabulary (no top-k, top-p 1: the rollouts' default) is made one of three ways, the same distribution with other
draws:

- "inverse_cdf": one uniform per row against the cumulative probabilities (CPUs: V uniforms per row are slow there);
- "gumbel": the Gumbel-max trick over a `[B, V]` tensor of uniforms (`gumbel_max`), where CUDA has no Triton;
- "philox": the same trick in two Triton kernels that make their uniforms in registers (`kernels.gumbel`): CUDA's
  default.
"""

from __future__ import annotations

import importlib.util

import torch

# `sample_next_tokens(full_vocabulary=...)`: the ways a draw over the whole vocabulary is made
FULL_VOCABULARY_DRAWS = ("inverse_cdf", "gumbel", "philox")

# Tokens tried before a full sort when sampling with top-p alone (see `sample_next_tokens`).
_NUCLEUS_PROBE = 256


def sample_next_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    full_vocabulary: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return its log-prob under the temperature-scaled distribution.

    `logits: [B, V]`. Temperature 0 is greedy (argmax; log-prob under T = 1). Otherwise the
    candidates are the `top_k` most likely tokens (all if 0), then the smallest prefix of them
    (by descending probability, renormalised over the candidates) whose mass reaches `top_p`;
    a token is drawn from the renormalised candidates. The returned log-prob is
    log_softmax(logits / T) over the full vocabulary, before truncation.

    `full_vocabulary`: how a draw over the whole vocabulary (no top-k, top-p 1) is made, "inverse_cdf"
    (`_inverse_cdf_sample`: one uniform per row, several passes over [B, V] in float32), "gumbel" (`gumbel_max`: V
    uniforms per row drawn into a tensor) or "philox" (`kernels.gumbel`: the Gumbel-max draw in two Triton
    kernels that make their uniforms in registers, from a seed drawn from `generator`; needs a CUDA device or
    Triton's interpreter); None: `default_full_vocabulary_draw`. The same distribution, other draws.

    Returns `token_ids: [B] long`, `logprobs: [B] float32`.
    """
    if full_vocabulary not in (None, *FULL_VOCABULARY_DRAWS):
        raise ValueError(f"full_vocabulary must be None or one of {FULL_VOCABULARY_DRAWS}, got {full_vocabulary!r}")
    vocab_size = logits.shape[-1]
    if temperature != 0 and not 0 < top_k < vocab_size and top_p >= 1:
        method = full_vocabulary or default_full_vocabulary_draw(logits.is_cuda)
        if method == "gumbel":
            uniform = torch.rand(logits.shape, generator=generator, device=logits.device)
            return gumbel_max(logits, uniform, float(temperature))
        if method == "philox":
            from ragen_lit.kernels.gumbel import gumbel_sample  # Triton: CUDA machines (or its interpreter)

            seed = torch.randint(0, 2**62, (1,), generator=generator, device=logits.device)
            return gumbel_sample(logits, float(temperature), seed)
    logits = logits.float()
    if temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token_ids = logprobs.argmax(dim=-1)
        return token_ids, logprobs.gather(-1, token_ids[:, None])[:, 0]
    # x / 1.0 == x exactly: skip a pass over [B, V] at the default temperature
    logprobs = torch.log_softmax(logits if temperature == 1 else logits / temperature, dim=-1)
    candidate_logprobs, candidate_ids = logprobs, None
    if 0 < top_k < vocab_size:
        candidate_logprobs, candidate_ids = logprobs.topk(top_k, dim=-1)
        candidate_logprobs = torch.log_softmax(candidate_logprobs, dim=-1)
    elif top_p < 1:
        # A full-vocabulary sort is slow on CPU; the nucleus usually lies inside the most likely few
        # hundred tokens, and when their mass reaches top_p in every row that prefix is exact.
        candidate_logprobs, candidate_ids = logprobs.topk(min(vocab_size, _NUCLEUS_PROBE), dim=-1)
        if bool((candidate_logprobs.exp().sum(dim=-1) < top_p).any()):
            candidate_logprobs, candidate_ids = logprobs.sort(dim=-1, descending=True)
    if top_p < 1:
        candidate_probs = candidate_logprobs.exp()
        mass_before = candidate_probs.cumsum(dim=-1) - candidate_probs
        # The most likely token always has mass_before == 0 < top_p, so no row is emptied.
        candidate_logprobs = candidate_logprobs.masked_fill(mass_before >= top_p, float("-inf"))
    choice = _inverse_cdf_sample(candidate_logprobs.exp(), generator)
    token_ids = choice if candidate_ids is None else candidate_ids.gather(-1, choice[:, None])[:, 0]
    return token_ids, logprobs.gather(-1, token_ids[:, None])[:, 0]


def default_full_vocabulary_draw(is_cuda: bool) -> str:
    """`sample_next_tokens`' draw when none is named: "philox" on CUDA where Triton is installed (PyTorch's CUDA builds
    for Linux bring it), "gumbel" on CUDA without it, "inverse_cdf" elsewhere (V uniforms per row are slow there)."""
    if not is_cuda:
        return "inverse_cdf"
    return "philox" if importlib.util.find_spec("triton") is not None else "gumbel"


def gumbel_max(logits: torch.Tensor, uniform: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A draw from softmax(logits / T) per row by the Gumbel-max trick: argmax(logits / T - log(-log u)) with
    `uniform: [B, V]` i.i.d. in [0, 1); and its log-prob log_softmax(logits / T) at the drawn token (one
    log-sum-exp). The reference of `kernels.gumbel`, which makes its uniforms inside its kernels (CUDA's
    default). Returns `token_ids: [B] long`, `logprobs: [B] float32`."""
    scaled = logits.float() / temperature
    token_ids = (scaled - torch.log(-torch.log(uniform))).argmax(dim=-1)
    chosen = scaled.gather(-1, token_ids[:, None])[:, 0]
    return token_ids, chosen - torch.logsumexp(scaled, dim=-1)


def _inverse_cdf_sample(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw index i of each row with probability weights[i] / sum(weights) (`weights: [B, V] >= 0`).

    One uniform per row against the cumulative weights: an order of magnitude faster on CPU than
    `torch.multinomial`, which spends V random numbers per row. A zero-weight index is never drawn,
    because the first cumulative weight above u * total has a positive increment.
    """
    cumulative = weights.cumsum(dim=-1)
    uniform = torch.rand(weights.shape[0], 1, generator=generator, device=weights.device)
    index = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True)[:, 0]
    return index.clamp(max=weights.shape[-1] - 1)
