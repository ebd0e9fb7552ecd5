"""SNR-aware filtering (docs/METHOD.md §4): score every prompt group by its within-group reward variance (RV),
keep the high-RV groups, and report the RV diagnostics logged every iteration.

A batch of rollouts is `rewards: [G, K] float`, G groups (prompts) × K rollouts each, one episode
return per rollout. The selection works on whole groups (`select_groups -> keep [G] bool`); the
paper's trajectory-level control (Table 7) works inside groups (`select_trajectories -> [G, K] bool`).

DAPO's dynamic sampling (`algo.dynamic_sampling`, `dynamic_sampling_keep`) is not one of these filters. The
filters only drop: `filter.strategy=nonzero` drops the zero-variance groups and trains on fewer than
`rollout.groups`. Dynamic sampling drops and refills: it generates further rounds of fresh groups until
`rollout.groups` groups with non-zero variance are in hand (at most `algo.max_sampling_rounds` rounds), so
the batch stays full. Both set: dynamic sampling runs first and the filter then selects among the groups it
kept, so `nonzero` keeps them all (it adds nothing) and `top_p` keeps the high-RV share of a full batch.

Conventions shared by every rule:
- score_g = Var_k(R_{g,k}) (population, `var`, the paper) or Std_k (ddof=1, `std`, the reference
  code; 0 when K = 1). A group with score ≤ 1e-10 counts as zero-variance.
- Order = descending score, ties broken by group index (stable sort), so a selection is reproducible
  and, with distinct scores, independent of the order in which groups are listed.
- Threshold comparisons (`top_p`, `top_p_softmax`, `min_p`) allow a relative slack of 1e-6, so a
  prefix whose mass equals ρ·M in exact arithmetic is not lost to floating-point rounding.
"""

from __future__ import annotations

import math

import torch

from ragen_lit.choices import SCORES, STRATEGIES, filter_value_error

ZERO_SCORE = 1e-10
_RELATIVE_SLACK = 1e-6


def _check_rewards(rewards: torch.Tensor) -> None:
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2 or not rewards.is_floating_point():
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a [G, K] float tensor (groups x rollouts), got {shape}")
    if rewards.shape[0] > 0 and rewards.shape[1] == 0:
        raise ValueError("rewards must hold at least one rollout per group (K >= 1), got K = 0")
    finite = torch.isfinite(rewards).all(dim=1)
    if not finite.all():
        bad = (~finite).nonzero().flatten().tolist()
        raise ValueError(f"rewards contain NaN or inf in groups {bad}; every episode return must be finite")


def _scores(rewards: torch.Tensor, score: str) -> torch.Tensor:
    """float64 [G] scores (float64 so that cumulative masses compare exactly enough)."""
    if score not in SCORES:
        raise ValueError(f"filter.score must be one of {SCORES}, got {score!r}")
    _check_rewards(rewards)
    rewards = rewards.double()
    if score == "var":
        return rewards.var(dim=1, unbiased=False)
    if rewards.shape[1] == 1:
        return torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    return rewards.std(dim=1, unbiased=True)


def reward_variance_scores(rewards: torch.Tensor, score: str = "var") -> torch.Tensor:
    """Per-group reward-variance score: Var_k(R_{g,k}) (ddof=0, `var`) or Std_k(R_{g,k}) (ddof=1, `std`,
    0 for K = 1).

    rewards: [G, K] float (finite) -> [G] float (rewards' dtype).
    """
    return _scores(rewards, score).to(rewards.dtype)


def _descending_order(scores: torch.Tensor) -> torch.Tensor:
    return torch.sort(scores, descending=True, stable=True).indices


def _rank_buckets(scores: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Bucket of each entry when the descending order is cut into `num_buckets` runs of equal count;
    with n = q·b + r the first r buckets hold one extra entry (numpy.array_split convention)."""
    n = scores.numel()
    rank = torch.empty(n, dtype=torch.long, device=scores.device)
    rank[_descending_order(scores)] = torch.arange(n, device=scores.device)
    sizes = torch.full((num_buckets,), n // num_buckets, dtype=torch.long, device=scores.device)
    sizes[: n % num_buckets] += 1
    return torch.searchsorted(sizes.cumsum(0), rank, right=True)


def _shortest_prefix(sorted_masses: torch.Tensor, value: float) -> int:
    """Length of the shortest prefix of non-increasing, non-negative masses whose sum reaches
    value·total (value < 1, total > 0)."""
    cumulative = sorted_masses.cumsum(0)
    threshold = value * cumulative[-1] * (1.0 - _RELATIVE_SLACK)
    return min(int(torch.searchsorted(cumulative, threshold)) + 1, sorted_masses.numel())


def _check_strategy_args(strategy: str, value: float, quartile: int | None) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"filter.strategy must be one of {STRATEGIES}, got {strategy!r}")
    value_error = filter_value_error(strategy, value)
    if value_error is not None:
        raise ValueError(value_error)
    if strategy == "quartile" and (isinstance(quartile, bool) or quartile not in (1, 2, 3, 4)):
        raise ValueError(f"filter.quartile must be one of (1, 2, 3, 4) for strategy 'quartile', got {quartile!r}")


def _select_candidates(
    strategy: str, scores: torch.Tensor, value: float, num_groups: int, quartile: int | None
) -> torch.Tensor:
    """keep [n] bool over the candidate scores [n] (candidates listed in group-index order)."""
    n = scores.numel()
    keep = torch.zeros(n, dtype=torch.bool, device=scores.device)
    if n == 0:
        return keep
    order = _descending_order(scores)
    if strategy == "none" or (strategy in ("top_p", "top_p_softmax") and value >= 1.0):
        keep[:] = True
    elif strategy == "nonzero":
        keep = scores > ZERO_SCORE
    elif strategy == "top_p":
        if scores[order[0]] > ZERO_SCORE:
            keep[order[: _shortest_prefix(scores[order], value)]] = True
    elif strategy == "top_p_softmax":
        probs = torch.softmax(scores, dim=0)
        keep[order[: _shortest_prefix(probs[order], value)]] = True
    elif strategy == "top_k":
        k = int(value) if value >= 1.0 else max(1, math.floor(value * num_groups))
        keep[order[:k]] = True
    elif strategy == "min_p":
        keep = scores >= value * scores.max() * (1.0 - _RELATIVE_SLACK)
    else:
        keep = _rank_buckets(scores, 4) == quartile - 1
    return keep


def select_groups(
    rewards: torch.Tensor,
    strategy: str = "top_p",
    value: float = 0.9,
    score: str = "var",
    include_zero: bool = True,
    quartile: int | None = None,
) -> torch.Tensor:
    """SNR-aware group selection (docs/METHOD.md §4): which prompt groups to train on.

    Candidates: every group, or with `include_zero=False` only groups with score > 1e-10 (this applies
    to every strategy). `value`'s range per strategy is the config's (`choices.filter_value_error`). Then, with
    candidates ordered by descending score:
    - `none`: keep every candidate.
    - `top_p` (linear, ρ = value): keep the shortest prefix whose cumulative score ≥ ρ·M, M the
      candidates' total score. ρ = 1 keeps every candidate (the no-filter baseline); otherwise a batch
      without any score > 1e-10 keeps nothing (that iteration makes no update).
    - `top_p_softmax`: the same prefix rule on p = softmax(scores) over the candidates; ρ = 1 keeps all;
      keeps at least one group whenever there is a candidate.
    - `top_k`: k = floor(value·G) (at least 1) for value < 1, G counting all groups; k = value for a
      whole value ≥ 1; keep the first min(k, #candidates) candidates.
    - `min_p`: keep candidates with score ≥ value·max score (value in [0, 1]).
    - `nonzero` (DAPO's zero-variance rule without its refill, see the module docstring): keep candidates
      with score > 1e-10; `value` is ignored.
    - `quartile` (Table 6): cut the candidates' descending order into 4 rank buckets of equal count
      (the first n mod 4 buckets one larger) and keep bucket `quartile` (1 = highest RV). Tied scores
      are ranked by group index, so a tie may straddle two quartiles.

    rewards: [G, K] float (finite) -> keep: [G] bool.
    """
    _check_strategy_args(strategy, value, quartile)
    scores = _scores(rewards, score)
    candidates = torch.ones_like(scores, dtype=torch.bool) if include_zero else scores > ZERO_SCORE
    candidate_index = candidates.nonzero().flatten()
    chosen = _select_candidates(strategy, scores[candidate_index], value, scores.numel(), quartile)
    keep = torch.zeros_like(candidates)
    keep[candidate_index[chosen]] = True
    return keep


def select_trajectories(rewards: torch.Tensor, value: float) -> torch.Tensor:
    """Trajectory-level control (Table 7): inside every group keep the n highest- and the n lowest-reward
    rollouts, n = max(1, floor(value·K / 2)), so about `value`·K of the K rollouts survive, half from
    each end. If 2n ≥ K (or value = 1) the whole group is kept. Order within a group is descending
    reward with ties broken by rollout index; the top n and the last n of that order are kept.

    rewards: [G, K] float (finite); value in (0, 1] -> keep: [G, K] bool.
    """
    _check_rewards(rewards)
    value_error = filter_value_error("top_p", value, level="trajectory")
    if value_error is not None:
        raise ValueError(value_error)
    num_groups, k = rewards.shape
    per_end = max(1, math.floor(value * k / 2))
    if 2 * per_end >= k:
        return torch.ones_like(rewards, dtype=torch.bool)
    order = torch.sort(rewards, dim=1, descending=True, stable=True).indices
    keep = torch.zeros_like(rewards, dtype=torch.bool)
    keep.scatter_(1, order[:, :per_end], True)
    keep.scatter_(1, order[:, k - per_end :], True)
    return keep


def dynamic_sampling_keep(rewards: torch.Tensor, num_groups: int) -> torch.Tensor:
    """DAPO dynamic sampling (Yu et al. 2025, §3.2: keep 0 < |{correct}| < G, i.e. groups whose rewards are
    not all equal): the first `num_groups` groups, in the listed order, whose population reward variance
    is > 1e-10. Groups after those are dropped too, so an over-filled batch is trimmed to exactly
    `num_groups`; fewer qualifying groups keep all of them.

    rewards: [G, K] float (finite); num_groups >= 0 -> keep: [G] bool (at most `num_groups` True).
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
    signal = _scores(rewards, "var") > ZERO_SCORE
    return signal & (signal.cumsum(0) <= num_groups)


def filter_stats(rewards: torch.Tensor, keep: torch.Tensor, score: str = "var") -> dict[str, float]:
    """Reward-variance diagnostics of one iteration (docs/METHOD.md §4, "Logged every iteration").

    - `kept_count`, `kept_ratio` (= kept / G), `empty` (1.0 if nothing is kept)
    - `reward_std_mean`, `reward_std_max`: in-group reward std (ddof=1, 0 for K = 1) over all groups;
      `kept_reward_std_mean`, `kept_reward_std_max`: the same over kept groups (0 if none)
    - a [G, K] `keep` (trajectory level, `select_trajectories`) counts rollouts: `kept_count` = kept rollouts,
      `kept_ratio` = kept rollouts / (G·K) (the keep rate the update is scaled by), and the kept std of a
      group is over its kept rollouts only (ddof=1, 0 for one), over the groups that keep any
    - `zero_variance_count`: groups whose population variance is ≤ 1e-10
    - `rv_cv` = Std(RV) / Mean(RV) over all groups (population std; 0 if Mean(RV) = 0), RV the
      `score` (`var` by default, the paper's predictor of when filtering helps)

    rewards: [G, K] float; keep: [G] or [G, K] bool -> dict of Python floats.
    """
    _check_rewards(rewards)
    if keep.dtype != torch.bool or keep.shape not in (rewards.shape[:1], rewards.shape):
        raise ValueError(
            f"keep must be a [G] = [{rewards.shape[0]}] or [G, K] = {list(rewards.shape)} bool tensor, "
            f"got {keep.dtype} {tuple(keep.shape)}"
        )
    num_groups = rewards.shape[0]
    stds = _scores(rewards, "std")
    if keep.dim() == 2:
        kept_per_group = keep.sum(1)
        kept_stds = _masked_stds(rewards.double(), keep)[kept_per_group > 0]
        kept_count, total = int(kept_per_group.sum()), keep.numel()
    else:
        kept_stds = stds[keep]
        kept_count, total = int(keep.sum()), num_groups
    rv = _scores(rewards, score)
    rv_mean = rv.mean() if num_groups else rv.new_zeros(())
    rv_cv = rv.std(unbiased=False) / rv_mean if rv_mean > 0 else rv.new_zeros(())
    return {
        "kept_count": float(kept_count),
        "kept_ratio": kept_count / total if total else 0.0,
        "reward_std_mean": float(stds.mean()) if num_groups else 0.0,
        "reward_std_max": float(stds.max()) if num_groups else 0.0,
        "kept_reward_std_mean": float(kept_stds.mean()) if kept_count else 0.0,
        "kept_reward_std_max": float(kept_stds.max()) if kept_count else 0.0,
        "zero_variance_count": float((_scores(rewards, "var") <= ZERO_SCORE).sum()),
        "rv_cv": float(rv_cv),
        "empty": 1.0 if kept_count == 0 else 0.0,
    }


def _masked_stds(rewards: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """[G] std (ddof=1) of each row's rewards where `keep` is True; 0 for rows with fewer than two."""
    count = keep.sum(1)
    mean = torch.where(keep, rewards, 0.0).sum(1) / count.clamp(min=1)
    squares = torch.where(keep, rewards - mean[:, None], 0.0).square().sum(1)
    return (squares / (count - 1).clamp(min=1)).sqrt()


def rv_buckets(scores: torch.Tensor, num_buckets: int = 6) -> torch.Tensor:
    """Equal-count RV buckets for the paper's Figure 3 gradient analysis, in its Q1 → Q6 ascending order:
    bucket 0 holds the lowest scores. Groups are ranked by ascending score (ties by group index) and the
    ranking is cut into `num_buckets` runs whose sizes differ by at most one (the first G mod b runs one larger).

    scores: [G] float -> [G] long in [0, num_buckets).
    """
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(f"num_buckets must be an int >= 1, got {num_buckets!r}")
    if scores.dim() != 1:
        raise ValueError(f"scores must be [G], got shape {tuple(scores.shape)}")
    return _rank_buckets(-scores, num_buckets)  # the descending order of -score is the ascending one
