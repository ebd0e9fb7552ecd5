"""Advantage estimators: GAE, bi-level (turn-level) GAE, GRPO / Dr.GRPO, RLOO, GiGPO, and keep-rate scaling.

The method: docs/METHOD.md §5 (and §4 for keep-rate scaling). Token tensors are `[B, T]` (B
trajectories, T token positions) with a bool `mask` marking the assistant (loss) tokens; sequence
tensors are `[B]`. Every function is pure; callers run them under `torch.no_grad()` on detached
rewards, values and scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ragen_lit.choices import KEEP_RATE_SCALINGS, uses_critic


def _check_token_tensors(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    for name, tensor in tensors.items():
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} must have the mask's shape {tuple(mask.shape)}, got {tuple(tensor.shape)}")


def _as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """`mask` as a bool tensor: bool is returned as is, a numeric mask must hold only 0 and 1 (1 → True).

    Numeric 0/1 masks are the common form elsewhere; any other value (e.g. 0.5, a padded -1) is refused
    rather than guessed at.
    """
    if mask.dtype == torch.bool:
        return mask
    other = mask[(mask != 0) & (mask != 1)]
    if other.numel():
        raise ValueError(f"mask must be bool or hold only 0 and 1, got {mask.dtype} holding {other[0].item()}")
    return mask == 1


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the masked token sequence (Schulman et al. 2016).

    δ_t = r_t + γ·V_{t'} − V_t,   A_t = δ_t + γλ·A_{t'},   R_t = A_t + V_t,
    where t' is the next position after t with `mask` True (V_{t'} = A_{t'} = 0 after the last one).
    Positions with `mask` False (environment / prompt / padding tokens) are skipped by the recursion:
    their rewards and values are ignored and they get advantage 0 and return 0. No whitening (see
    `whiten`). With γ = λ = 1, A_t is the masked return-to-go minus V_t.

    rewards, values: [B, T] float; mask: [B, T] bool (a 0/1 numeric mask is accepted as the same bool mask)
    -> (advantages [B, T], returns [B, T]).
    """
    mask = _as_bool_mask(mask)
    _check_token_tensors(mask, rewards=rewards, values=values)
    advantages = _gae_recursion(rewards, values, mask, gamma, lam)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


def _gae_recursion(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    fixed_at: torch.Tensor | None = None,
    fixed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The backward GAE recursion of `gae` over the positions where `mask` is True (no checks).

    δ_t = r_t + γ·V_{t'} − V_t,   A_t = δ_t + γλ·A_{t'},   t' the next masked position after t.
    Where `fixed_at` is True, A_t is `fixed[:, t]` instead (and that value is what earlier positions
    bootstrap from): `bilevel_gae` pins each turn's end token to its turn-level advantage this way.

    rewards, values: [B, T] float; mask: [B, T] bool; fixed_at: [B, T] bool; fixed: [B, T] float
    -> advantages [B, T] (0 where `mask` is False).
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        if fixed_at is not None:
            advantage = torch.where(fixed_at[:, t], fixed[:, t], advantage)
        advantages[:, t] = torch.where(valid, advantage, 0.0)
        next_value = torch.where(valid, values[:, t], next_value)
        next_advantage = torch.where(valid, advantage, next_advantage)
    return advantages


def whiten(
    advantages: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Masked whitening: Â = (A − μ) / sqrt(σ² + eps), μ and σ² over the valid tokens of the whole batch.

    μ = Σ A / n and σ² = Σ (A − μ)² / (n − 1), n the number of valid tokens: the unbiased (ddof=1)
    variance, as in the reference code's masked whitening; with a single valid token it is taken as 0.
    `shift_mean=False` adds μ back (scale only). Positions with `mask` False are 0 in the output; with no
    valid token the output is all 0.

    `reduce` sums a tensor over the ranks that hold the batch's other rows (e.g.
    `parallel.collectives.sum_over_ranks`): n, Σ A and Σ (A − μ)² are then the whole batch's, so every rank
    whitens its rows as one process would whiten all of them (the same two passes; `reduce=None`: the
    batch is this tensor alone). With `reduce`, every rank must call this, one without rows on [0, T] tensors.

    advantages: [B, T] float; mask: [B, T] bool -> [B, T] float.
    """
    _check_token_tensors(mask, advantages=advantages)
    total = reduce if reduce is not None else (lambda t: t)
    count = total(mask.sum())
    if count == 0:
        return torch.zeros_like(advantages)
    mean = total(torch.where(mask, advantages, 0.0).sum()) / count
    centred = torch.where(mask, advantages - mean, 0.0)
    squares = total(centred.pow(2).sum())
    variance = squares / (count - 1) if count > 1 else squares
    whitened = centred * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, 0.0)


def _last_valid_position(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool, True at each row's last True position of `mask`."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1, keepdim=True).values
    return mask & (positions == last)


def bilevel_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_end_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level (turn-level) GAE, docs/METHOD.md §5.

    A turn k is the run of valid tokens after the previous turn end up to and including its end token
    e_k (`turn_end_mask`; each row's last valid token always closes a turn, so tokens after the last
    marked end are not orphaned).

    1. Turn level, over the end tokens only, with discount γ_h = `high_level_gamma`:
       δ_k = r_{e_k} + γ_h·V_{e_{k+1}} − V_{e_k},   A_k = δ_k + γ_h·λ·A_{k+1}   (0 after the last turn).
       The turn's reward is the reward on its end token (where the episode / turn reward sits).
    2. Token level, inside each turn, with γ and λ: the end token gets the terminal reward A_k + V_{e_k}
       and no bootstrap, so its advantage is A_k; earlier tokens t of the turn follow `gae` within the
       turn (their own rewards r_t, bootstrapping from the next valid token of the same turn).
    Returns R_t = A_t + V_t on valid tokens. Unlike the reference code, no whitening is applied here
    (call `whiten` separately, as for `gae`).

    rewards, values: [B, T] float; mask, turn_end_mask: [B, T] bool (turn ends must be valid tokens)
    -> (advantages [B, T], returns [B, T]).
    """
    _check_token_tensors(mask, rewards=rewards, values=values, turn_end_mask=turn_end_mask)
    if turn_end_mask.dtype != torch.bool:
        raise ValueError(f"turn_end_mask must be a bool tensor, got dtype {turn_end_mask.dtype}")
    if (turn_end_mask & ~mask).any():
        raise ValueError("turn_end_mask marks positions where mask is False; turn ends must be loss tokens")
    turn_end = turn_end_mask | _last_valid_position(mask)

    # Step 1 is GAE over the turn-end tokens alone, step 2 GAE over all valid tokens with the ends pinned.
    turn_advantages = _gae_recursion(rewards, values, turn_end, high_level_gamma, lam)
    advantages = _gae_recursion(rewards, values, mask, gamma, lam, fixed_at=turn_end, fixed=turn_advantages)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


def _group_index(group_ids: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense group index [B], group sums [G], group sizes [G]) for arbitrary integer group ids."""
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be [B], got {tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point():
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    _, index = torch.unique(group_ids, return_inverse=True)
    num_groups = int(index.max()) + 1 if index.numel() else 0
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    sums = zeros.index_add(0, index, scores)
    sizes = zeros.index_add(0, index, torch.ones_like(scores))
    return index, sums, sizes


def group_normalized_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO / Dr.GRPO sequence advantage: A_i = (s_i − mean_g) / (std_g + eps), g the group of i.

    std_g is the sample std (ddof=1) of the group's scores. `std_normalize=False` is Dr.GRPO's plain
    mean-centring A_i = s_i − mean_g. A group of one gets advantage 0 (no baseline exists).

    scores: [B] float (trajectory returns); group_ids: [B] int (any values) -> [B] float.
    """
    index, sums, sizes = _group_index(group_ids, scores)
    mean = sums / sizes
    centred = scores - mean[index]
    if std_normalize:
        squares = torch.zeros_like(sums).index_add_(0, index, centred.pow(2))
        std = torch.sqrt(squares / (sizes - 1).clamp_min(1))
        centred = centred / (std[index] + eps)
    return torch.where(sizes[index] > 1, centred, 0.0)


def rloo_advantages(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO sequence advantage: A_i = s_i − (1/(n_g − 1))·Σ_{j∈g, j≠i} s_j (leave-one-out baseline).

    A group of one gets advantage 0.

    scores: [B] float; group_ids: [B] int -> [B] float.
    """
    index, sums, sizes = _group_index(group_ids, scores)
    others = sizes[index] - 1
    baseline = (sums[index] - scores) / others.clamp_min(1)
    return torch.where(others > 0, scores - baseline, 0.0)


def broadcast_to_tokens(seq_advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A_{i,t} = A_i on every valid token of sequence i, 0 elsewhere (GRPO-family token advantages).

    seq_advantages: [B] float; mask: [B, T] bool -> [B, T] float.
    """
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask must be a [B, T] bool tensor, got {mask.dtype} {tuple(mask.shape)}")
    if seq_advantages.shape != mask.shape[:1]:
        raise ValueError(f"seq_advantages must be [B] = [{mask.shape[0]}], got {tuple(seq_advantages.shape)}")
    return torch.where(mask, seq_advantages[:, None], 0.0)


def _turn_index(mask: torch.Tensor, turn_end_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(turn of each token [B, T] long, -1 where `mask` is False; turn ends [B, T] bool). Turn k of a row is
    the run of valid tokens after its (k-1)-th end up to and including its k-th end; each row's last valid
    token always closes a turn (as in `bilevel_gae`)."""
    ends = (turn_end_mask & mask) | _last_valid_position(mask)
    before = torch.cumsum(ends.long(), dim=1) - ends.long()
    return torch.where(mask, before, -1), ends


def _anchor_step_groups(
    group_ids: torch.Tensor, mask: torch.Tensor, turn_end_mask: torch.Tensor, turn_state_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GiGPO's step groups: (turn of each token [B, T] long (-1 off `mask`); which turns exist [B, K] bool;
    step group of each turn [B, K] long, equal for the turns of one episode group taken in one state, -1 for a
    turn without a state id or beyond the row's turns), K the most turns of any row."""
    turn, ends = _turn_index(mask, turn_end_mask)
    num_turns = int(turn.max()) + 1 if mask.any() else 0
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)
    turns = torch.zeros(mask.shape[0], num_turns, dtype=torch.bool, device=mask.device)
    turns[rows[ends], turn[ends]] = True
    states = torch.full((mask.shape[0], num_turns), -1, dtype=torch.long, device=mask.device)
    states[rows[ends], turn[ends]] = turn_state_ids[ends].long()
    step_group = torch.full_like(states, -1)
    anchored = states >= 0
    if anchored.any():
        pairs = torch.stack([group_ids[:, None].expand_as(states)[anchored], states[anchored]], dim=1)
        step_group[anchored] = torch.unique(pairs, dim=0, return_inverse=True)[1]
    return turn, turns, step_group


def anchored_step_fraction(
    group_ids: torch.Tensor, mask: torch.Tensor, turn_end_mask: torch.Tensor, turn_state_ids: torch.Tensor
) -> float:
    """The share of steps (turns) whose anchor state another step of their episode group also visits, i.e.
    that get a step-level advantage in `gigpo_advantages` (0.0 without turns). Tensors as there."""
    _, turns, step_group = _anchor_step_groups(group_ids, mask, turn_end_mask, turn_state_ids)
    if not turns.any():
        return 0.0
    anchored = step_group[step_group >= 0]
    sizes = torch.bincount(anchored)
    shared = (sizes[anchored] > 1).sum()
    return float(shared / turns.sum())


def gigpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    turn_end_mask: torch.Tensor,
    turn_state_ids: torch.Tensor,
    gamma: float = 0.95,
    episode_weight: float = 1.0,
    step_weight: float = 1.0,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GiGPO token advantages (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training").

    A step is one assistant turn k of trajectory i (its tokens as in `bilevel_gae`: the valid tokens up to
    and including its end token), taken in the environment state s_k^(i) its prompt showed.

    - Episode relative advantage A^E, the GRPO advantage of the episode return R(τ_i) = `scores`:
        A^E(τ_i) = (R(τ_i) − mean_{j∈g} R(τ_j)) / F_norm,   g the episode group of i (`group_ids`).
    - Anchor state grouping G^S(s̃): the step group of an anchor state s̃ is every (trajectory, turn) of the
      same episode group whose state is s̃, G^S(s̃) = {(a_k^(i), R_k^(i)) | s_k^(i) = s̃}, with the
      discounted return of each step, R_k^(i) = Σ_{k'≥k} γ^{k'−k} r_{k'}^(i), r_k the turn's reward (the
      sum of `token_rewards` over its tokens).
    - Step relative advantage A^S:(a_k^(i)) = (R_k^(i) − mean_{G^S(s̃)} R) / F_norm.
    - Combined advantage: A(a_k^(i)) = w_E·A^E(τ_i) + w_S·A^S(a_k^(i)), on every token of turn k. The paper's
      is A^E + ω·A^S with ω = 1 (w_E = 1, w_S = ω) and γ = 0.95.
    F_norm is the group's sample std (ddof=1) + eps (`std_normalize`, the paper's default) or 1 (its
    mean-centred variant). A group of one (an episode group of one rollout, a state only one step visited)
    has no baseline: its advantage is 0, as in `group_normalized_advantages`. A turn whose state id is
    negative (the env gives no state key) joins no step group: A^S = 0.

    scores: [B] float; group_ids: [B] int; token_rewards: [B, T] float; mask, turn_end_mask: [B, T] bool;
    turn_state_ids: [B, T] long, the turn's state id on its end token (any non-negative ids, equal ids =
    identical states; read only at turn ends) -> advantages [B, T] float (0 where `mask` is False).
    """
    _check_token_tensors(mask, token_rewards=token_rewards, turn_end_mask=turn_end_mask, turn_state_ids=turn_state_ids)
    if turn_end_mask.dtype != torch.bool:
        raise ValueError(f"turn_end_mask must be a bool tensor, got dtype {turn_end_mask.dtype}")
    if turn_state_ids.is_floating_point():
        raise ValueError(f"turn_state_ids must be an integer tensor, got dtype {turn_state_ids.dtype}")
    episode = group_normalized_advantages(scores, group_ids, std_normalize=std_normalize, eps=eps)
    turn, turns, step_group = _anchor_step_groups(group_ids, mask, turn_end_mask, turn_state_ids)
    num_turns = turns.shape[1]
    if num_turns == 0:
        return torch.zeros_like(token_rewards)
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)
    # per-turn rewards r_k as a [B, K] table, then the discounted returns R_k = r_k + γ·R_{k+1}
    turn_rewards = torch.zeros(mask.shape[0], num_turns, dtype=token_rewards.dtype, device=mask.device)
    turn_rewards.index_put_((rows[mask], turn[mask]), token_rewards[mask], accumulate=True)
    returns = torch.zeros_like(turn_rewards)
    following = torch.zeros_like(turn_rewards[:, 0])
    for k in reversed(range(num_turns)):
        following = turn_rewards[:, k] + gamma * following
        returns[:, k] = following
    anchored = step_group >= 0
    step = torch.zeros_like(returns)
    if anchored.any():
        step[anchored] = group_normalized_advantages(
            returns[anchored], step_group[anchored], std_normalize=std_normalize, eps=eps
        )
    per_turn = episode_weight * episode[:, None].to(step.dtype) + step_weight * step
    return torch.where(mask, per_turn.gather(1, turn.clamp_min(0)), 0.0)


def scale_by_keep_rate(advantages: torch.Tensor, keep_ratio: float, mode: str) -> torch.Tensor:
    """Keep-rate advantage scaling (docs/METHOD.md §4): A·1 (`none`), A·ρ (`linear`), A·√ρ (`sqrt`),
    ρ = kept groups / all groups. It scales the policy-gradient term only.

    advantages: any shape float; keep_ratio in [0, 1] -> same shape.
    """
    if mode not in KEEP_RATE_SCALINGS:
        raise ValueError(f"filter.advantage_scaling must be one of {KEEP_RATE_SCALINGS}, got {mode!r}")
    if not 0.0 <= keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in [0, 1], got {keep_ratio}")
    if mode == "linear":
        return advantages * keep_ratio
    if mode == "sqrt":
        return advantages * math.sqrt(keep_ratio)
    return advantages


def estimate_advantages(
    estimator: str,
    mask: torch.Tensor,
    *,
    token_rewards: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    turn_end_mask: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
    whiten_advantages: bool = False,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    turn_state_ids: torch.Tensor | None = None,
    gigpo_gamma: float = 0.95,
    gigpo_episode_weight: float = 1.0,
    gigpo_step_weight: float = 1.0,
    gigpo_std_normalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token advantages of the estimator `algo.advantage` names (docs/METHOD.md §5), in one place for every caller.

    - `gae`: `gae(token_rewards, values, mask, γ, λ)`; `bilevel_gae`: `bilevel_gae(…, turn_end_mask, …, γ_h)`;
      both then `whiten`ed when `whiten_advantages` (over all ranks' rows with `reduce`, see `whiten`), and both
      return their returns R_t (the critic's targets).
    - `grpo` (std-normalised), `drgrpo` (mean-centred only), `rloo` (leave-one-out baseline): one advantage per
      trajectory from `scores` within its `group_ids` group, broadcast to its valid tokens; no returns (no critic).
    - `gigpo`: `gigpo_advantages` (episode + anchor-state step advantages per turn, from `scores`, `group_ids`,
      `token_rewards`, `turn_end_mask` and `turn_state_ids`); no returns.
    Keep-rate scaling (`scale_by_keep_rate`) is a separate step.

    mask, turn_end_mask: [B, T] bool; token_rewards, values: [B, T] float; scores: [B] float; group_ids: [B] int;
    turn_state_ids: [B, T] long -> (advantages [B, T], returns [B, T] or None).
    """
    if uses_critic(estimator):  # also rejects an unknown name
        if estimator == "gae":
            advantages, returns = gae(token_rewards, values, mask, gamma=gamma, lam=lam)
        else:
            advantages, returns = bilevel_gae(
                token_rewards, values, mask, turn_end_mask, gamma=gamma, lam=lam, high_level_gamma=high_level_gamma
            )
        if whiten_advantages:
            advantages = whiten(advantages, mask, reduce=reduce)
        return advantages, returns
    if estimator == "gigpo":
        advantages = gigpo_advantages(
            scores,
            group_ids,
            token_rewards,
            mask,
            turn_end_mask,
            turn_state_ids,
            gamma=gigpo_gamma,
            episode_weight=gigpo_episode_weight,
            step_weight=gigpo_step_weight,
            std_normalize=gigpo_std_normalize,
        )
        return advantages, None
    if estimator == "rloo":
        seq_advantages = rloo_advantages(scores, group_ids)
    else:
        seq_advantages = group_normalized_advantages(scores, group_ids, std_normalize=estimator == "grpo")
    return broadcast_to_tokens(seq_advantages, mask), None
