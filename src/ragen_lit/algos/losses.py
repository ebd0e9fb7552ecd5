"""PPO-family losses: clipped policy surrogate (clip-higher + dual-clip), clipped value loss, KL
estimators against a frozen reference, and the loss aggregation modes of docs/METHOD.md §5.

Token tensors are `[B, T]` with a bool loss `mask` (assistant tokens). Losses are returned as 0-dim
tensors carrying gradient; stats are 0-dim detached tensors. Every value at a position with `mask`
False is ignored, even NaN/inf padding, without leaking NaN into the gradient.
"""

from __future__ import annotations

import torch

from ragen_lit.algos.advantages import _check_token_tensors
from ragen_lit.choices import KL_ESTIMATORS, LOSS_AGG_MODES

# Keeps exp() and its gradient finite for wildly off-policy tokens (|log ρ| > 20 means ρ > 4.8e8).
_MAX_LOG_RATIO = 20.0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached mean of `values` over `mask` (0 when the mask is empty), for logging."""
    values = torch.where(mask, values.detach().float(), 0.0)
    return values.sum() / mask.sum().clamp_min(1)


def _divide(total: torch.Tensor, denominator: torch.Tensor | float, mask: torch.Tensor, name: str) -> torch.Tensor:
    """`total / denominator`, and 0 (still attached to the graph) where the denominator is 0. A number or a CPU
    tensor is checked first: >= 0, and not 0 while `mask` holds tokens. A denominator on a device is not read on
    the host (the update's totals, clamped to >= 1): the loss then never waits for the device between a
    micro-batch's forward and its backward."""
    if not torch.is_tensor(denominator) or denominator.device.type == "cpu":
        if denominator < 0:
            raise ValueError(f"{name} must be >= 0, got {denominator}")
        if denominator == 0 and bool(mask.any()):
            raise ValueError(f"{name} is 0 but the mask has valid tokens")
    if not torch.is_tensor(denominator):
        return total / denominator if denominator else total * 0.0
    positive = denominator > 0
    return torch.where(positive, total / torch.where(positive, denominator, 1), total * 0.0)


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: int | float | torch.Tensor | None = None,
    num_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ℓ_{i,t} to a scalar (docs/METHOD.md §5, `algo.loss_agg`).

    With n_i = Σ_t m_{i,t} valid tokens in sequence i, S = the sequences with n_i > 0:
      token-mean               Σ_{i,t} m·ℓ / N_tok                       (N_tok = Σ n_i)
      seq-mean-token-mean      Σ_{i∈S} (Σ_t m·ℓ / n_i) / N_seq          (N_seq = |S|; GRPO)
      seq-mean-token-sum       Σ_{i,t} m·ℓ / N_seq
      seq-mean-token-sum-norm  Σ_{i,t} m·ℓ / (N_seq · L)                  (Dr.GRPO; L = `norm_length`,
                                                                          a constant, default T)
    Sequences whose mask is all False contribute 0 and are not counted in N_seq (a padding row must
    not dilute the mean). An empty mask gives 0 (still attached to the graph).

    Gradient accumulation: for a mini-batch split into micro-batches, pass the mini-batch totals
    `num_tokens` (= N_tok) and `num_seqs` (= N_seq) to every micro-batch call (and the same
    `norm_length`); the sum of the micro-batch losses then equals the whole mini-batch's loss.

    loss_mat: [B, T] float; mask: [B, T] bool -> 0-dim float.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"algo.loss_agg must be one of {LOSS_AGG_MODES}, got {mode!r}")
    _check_token_tensors(mask, loss_mat=loss_mat)
    masked = torch.where(mask, loss_mat, 0.0)
    tokens_per_seq = mask.sum(dim=1)
    if mode == "token-mean":
        tokens = tokens_per_seq.sum() if num_tokens is None else num_tokens
        return _divide(masked.sum(), tokens, mask, "num_tokens")
    seqs = (tokens_per_seq > 0).sum() if num_seqs is None else num_seqs
    if mode == "seq-mean-token-mean":
        per_seq_mean = masked.sum(dim=1) / tokens_per_seq.clamp_min(1)
        return _divide(per_seq_mean.sum(), seqs, mask, "num_seqs")
    if mode == "seq-mean-token-sum":
        return _divide(masked.sum(), seqs, mask, "num_seqs")
    length = mask.shape[1] if norm_length is None else norm_length
    if length <= 0:
        raise ValueError(f"norm_length must be > 0, got {length}")
    return _divide(masked.sum(), seqs * length, mask, "num_seqs")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    loss_agg: str = "token-mean",
    **agg_kwargs,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with clip-higher (DAPO) and dual-clip (Ye et al. 2020), per token:

      ρ = exp(log π_θ − log π_old)
      ℓ = max(−A·ρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high))
      ℓ = min(ℓ, c·|A|)  where A < 0 and c = `dual_clip` (> 1; None or 0 disables)
    then aggregated by `aggregate_loss(ℓ, mask, loss_agg, **agg_kwargs)`.

    Stats (detached, means over the mask): `clipfrac` (tokens where the ratio clip binds),
    `dual_clipfrac` (tokens where the dual-clip bound binds), `approx_kl` (k3 estimate of
    KL(π_old ‖ π_θ): ρ − 1 − log ρ), `ratio_mean`.

    logprobs (with grad), old_logprobs, advantages: [B, T] float; mask: [B, T] bool
    -> (0-dim loss, stats).
    """
    _check_token_tensors(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"algo.clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"algo.clip_high must be >= 0, got {clip_high}")
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"algo.dual_clip must be > 1 (or 0 / None to disable), got {dual_clip}")
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    advantages = torch.where(mask, advantages, 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(mask)
    if dual_clip:
        bound = -advantages * dual_clip
        dual_active = (advantages < 0) & (loss_mat > bound)
        loss_mat = torch.where(dual_active, bound, loss_mat)
    loss = aggregate_loss(loss_mat, mask, loss_agg, **agg_kwargs)
    stats = {
        "clipfrac": _masked_mean(clipped > unclipped, mask),
        "dual_clipfrac": _masked_mean(dual_active, mask),
        "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
    }
    return loss, stats


def actor_loss(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    entropy_coef: float = 0.0,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    loss_agg: str = "token-mean",
    **agg_kwargs,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The actor's loss (docs/METHOD.md §5): L = L_pg − c_H·agg(H) + c_KL·agg(KL(π_θ ‖ π_ref)), c_H = `entropy_coef`,
    c_KL = `kl_coef`, every term aggregated by `aggregate_loss(·, mask, loss_agg, **agg_kwargs)`.

    Each term is present when its inputs are: L_pg (`policy_loss`) when `advantages` (and `old_logprobs`) are
    given, the entropy bonus when `entropy` is, the KL penalty (`kl_penalty` with `kl_estimator`) when
    `kl_coef` > 0 (then `ref_logprobs` is needed). The update passes all three; the paper's Fig. 3 analysis
    takes the task part (L_pg alone) and the regulariser (no `advantages`) apart.

    Stats (detached): `policy_loss`'s, plus `pg_loss` (L_pg) with the task term and `kl` (agg(KL)) with the
    penalty.

    logprobs (with grad), old_logprobs, advantages, entropy, ref_logprobs: [B, T] float; mask: [B, T] bool
    -> (0-dim loss, stats).
    """
    loss, stats = None, {}
    if advantages is not None:
        loss, stats = policy_loss(
            logprobs,
            old_logprobs,
            advantages,
            mask,
            clip_low=clip_low,
            clip_high=clip_high,
            dual_clip=dual_clip,
            loss_agg=loss_agg,
            **agg_kwargs,
        )
        stats["pg_loss"] = loss.detach()
    if entropy is not None:
        bonus = aggregate_loss(entropy, mask, loss_agg, **agg_kwargs)
        loss = -entropy_coef * bonus if loss is None else loss - entropy_coef * bonus
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("actor_loss: kl_coef > 0 needs ref_logprobs")
        kl = aggregate_loss(kl_penalty(logprobs, ref_logprobs, kl_estimator), mask, loss_agg, **agg_kwargs)
        stats["kl"] = kl.detach()
        loss = kl_coef * kl if loss is None else loss + kl_coef * kl
    if loss is None:
        raise ValueError("actor_loss: no term to compute (give advantages, entropy, or kl_coef > 0)")
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.5,
    loss_agg: str = "token-mean",
    **agg_kwargs,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO), per token:

      ℓ = ½·max((V − R)², (V_old + clip(V − V_old, −ε, ε) − R)²),   ε = `clip`
    (None or 0 disables clipping: ℓ = ½(V − R)²), aggregated like the policy loss.

    Stats (detached, means over the mask): `clipfrac` (tokens where the clipped term binds),
    `value_mean`, `return_mean`.

    values (with grad), old_values, returns: [B, T] float; mask: [B, T] bool -> (0-dim loss, stats).
    """
    _check_token_tensors(mask, values=values, old_values=old_values, returns=returns)
    if clip is not None and clip < 0.0:
        raise ValueError(f"algo.value_clip must be >= 0 (0 or None disables), got {clip}")
    returns = torch.where(mask, returns, 0.0)
    unclipped = (values - returns).pow(2)
    loss_mat = unclipped
    clip_active = torch.zeros_like(mask)
    if clip:
        old_values = torch.where(mask, old_values, 0.0)
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (clipped_values - returns).pow(2)
        clip_active = clipped > unclipped
        loss_mat = torch.maximum(unclipped, clipped)
    loss = 0.5 * aggregate_loss(loss_mat, mask, loss_agg, **agg_kwargs)
    stats = {
        "clipfrac": _masked_mean(clip_active, mask),
        "value_mean": _masked_mean(values, mask),
        "return_mean": _masked_mean(returns, mask),
    }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from samples of π_θ (Schulman's k1/k2/k3),
    with d = log π_θ − log π_ref:

      k1 = d,   k2 = ½·d²,   k3 = exp(−d) + d − 1   (= exp(ref − logp) − (ref − logp) − 1, ≥ 0)

    logprobs, ref_logprobs: [B, T] float -> [B, T] float (aggregate it with `aggregate_loss`).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"algo.kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            "logprobs and ref_logprobs must have the same shape, "
            f"got {tuple(logprobs.shape)} and {tuple(ref_logprobs.shape)}"
        )
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    return torch.exp(-log_ratio) + log_ratio - 1.0
