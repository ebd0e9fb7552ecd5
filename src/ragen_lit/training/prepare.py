"""An iteration's kept rollouts made ready for the update, as functions `AgentRLModule.prepare_batch` wires: the model
passes over the micro-batches (old and reference log-probs, values), the advantages, and the metrics of the pass."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch

from ragen_lit.algos import anchored_step_fraction, estimate_advantages, scale_by_keep_rate
from ragen_lit.config import AlgoConfig, FilterConfig
from ragen_lit.logprobs import mean_abs_logprob_diff
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.training.batch import merge_micro_batches

log = logging.getLogger(__name__)
# Mean |log-prob| gap between engine and trainer above which a run warns once (bf16 noise is ~1e-2; a stale tied
# head gave 0.8).
LOGPROB_GAP_WARNING = 0.1


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def score_micro_batches(
    micros: Iterable[tuple[dict[str, torch.Tensor], bool]], score: Callable[[dict[str, torch.Tensor]], dict]
) -> dict[str, list[torch.Tensor]]:
    """`score(micro)`'s tensors (by name) of every real micro-batch, in order; a lock-step dummy's are dropped."""
    parts = defaultdict(list)
    for micro, real in micros:
        scored = score(micro)
        for k, v in scored.items():
            if real:
                parts[k].append(v)
    return parts


def advantages_of(a: AlgoConfig, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`estimate_advantages` of this rank's rows, as `algo.*` (`a`) asks; GAE whitening uses the sums over all ranks'
    rows, so that a multi-rank run whitens as the single process on all rows does (a collective when whitening)."""
    return estimate_advantages(
        a.advantage,
        batch["loss_mask"],
        token_rewards=batch["token_rewards"],
        values=batch.get("values"),
        turn_end_mask=batch["turn_end_mask"],
        scores=batch["scores"],
        group_ids=batch["group_ids"],
        gamma=a.gamma,
        lam=a.lam,
        high_level_gamma=a.high_level_gamma,
        whiten_advantages=a.whiten_advantages,
        reduce=dist_utils.sum_over_ranks,
        turn_state_ids=batch.get("turn_state_ids"),
        gigpo_gamma=a.gigpo_gamma,
        gigpo_episode_weight=a.gigpo_episode_weight,
        gigpo_step_weight=a.gigpo_step_weight,
        gigpo_std_normalize=a.gigpo_std_normalize,
    )


def no_rows(device: torch.device) -> dict[str, torch.Tensor]:
    """An empty batch (no rows, one token position) with the keys `estimate_advantages` reads: what a rank that kept
    nothing adds to the whitening sums, which every rank must join."""
    tokens, flags = torch.zeros(0, 1, device=device), torch.zeros(0, 1, dtype=torch.bool, device=device)
    return {
        "loss_mask": flags,
        "token_rewards": tokens,
        "values": tokens,
        "turn_end_mask": flags,
        "turn_state_ids": torch.zeros(0, 1, dtype=torch.long, device=device),
        "scores": torch.zeros(0, device=device),
        "group_ids": torch.zeros(0, dtype=torch.long, device=device),
    }


class LogprobGap:
    """`rollout/logprob_gap`: mean |engine log-prob − trainer log-prob| of the sampled tokens. Both score the same
    weights at the same temperature, so it is numerical noise (~1e-2 in bf16) unless the engine computes with weights
    the trainer no longer has (a partial or missed sync); above `LOGPROB_GAP_WARNING` a run warns once."""

    def __init__(self, engine: str):
        self.engine = engine
        self.warned = False

    def __call__(self, sample_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
        gap = mean_abs_logprob_diff(sample_logprobs, old_logprobs, mask.bool())
        if gap > LOGPROB_GAP_WARNING and not self.warned:
            log.warning(
                "rollout/logprob_gap=%.3f: the rollout engine (%s) and the trainer disagree on the sampled tokens' "
                "log-probs by more than %.2f; the engine may be computing with stale weights",
                gap,
                self.engine,
                LOGPROB_GAP_WARNING,
            )
            self.warned = True
        return gap


def finish_batch(
    algo: AlgoConfig,
    filter: FilterConfig,
    batch: dict[str, torch.Tensor],
    parts: dict[str, list[torch.Tensor]],
    keep_ratio: float,
    logprob_gap: LogprobGap,
) -> dict[str, float]:
    """After the passes: their micro-batch outputs (`parts`) merged into `batch`, then `returns` and `advantages`
    (scaled by the keep rate as `filter.advantage_scaling` asks), in place; returns the iteration's metrics."""
    mask = batch["loss_mask"]
    for k, v in parts.items():
        batch[k] = merge_micro_batches(v, batch)
    advantages, returns = advantages_of(algo, batch)
    if returns is not None:
        batch["returns"] = returns
    batch["advantages"] = scale_by_keep_rate(advantages, keep_ratio, filter.advantage_scaling)
    metrics = {"actor/advantage_mean": masked_mean(batch["advantages"], mask)}
    if "entropy" in parts:
        metrics["actor/entropy"] = masked_mean(batch.pop("entropy"), mask)
        metrics["rollout/logprob_gap"] = logprob_gap(batch["sample_logprobs"], batch["old_logprobs"], mask)
    if "values" in parts:
        metrics["critic/value_mean"] = masked_mean(batch["values"], mask)
    if algo.advantage == "gigpo":
        metrics["gigpo/anchored_step_fraction"] = anchored_step_fraction(
            batch["group_ids"], mask, batch["turn_end_mask"], batch["turn_state_ids"]
        )
    return metrics
