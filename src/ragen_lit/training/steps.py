"""What one PPO/GRPO optimizer step needs besides its micro-batch loop, which `AgentRLModule.update` runs: the actor
loss's settings, the mini-batch totals that normalise every micro-batch's loss, the old log-probs taken from the
update itself (`OldPolicyFromUpdate`, the speed path), and the optimizer step (gradient sum over ranks, clipping)."""

from __future__ import annotations

import math
import time

import torch

from ragen_lit.config import AlgoConfig, RolloutConfig
from ragen_lit.logprobs import LogProbs
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.training.batch import merge_micro_batches
from ragen_lit.training.prepare import LogprobGap, masked_mean


def loss_settings(a: AlgoConfig, r: RolloutConfig) -> dict:
    """`actor_loss`'s settings from `algo.*`; Dr.GRPO's constant length is the whole response budget (`rollout.*`)."""
    return {
        "clip_low": a.clip_low,
        "clip_high": a.clip_high,
        "dual_clip": a.dual_clip or None,
        "loss_agg": a.loss_agg,
        "entropy_coef": a.entropy_coef,
        "kl_coef": a.kl_coef,
        "kl_estimator": a.kl_estimator,
        "norm_length": r.max_turns * r.max_new_tokens,
    }


class OldPolicyFromUpdate:
    """The speed path of `optim.old_logprobs_from_update`: the update's own log-probs, detached, serve as the old
    log-probs, and prepare skips its policy pass (one forward over the batch). It applies when the iteration takes
    one optimizer step (`algo.ppo_epochs` 1, `optim.num_minibatches` 1; `AgentRLModule.old_logprobs_in_update`).

    It is exact: every micro-batch of that one step is scored before the step, at the weights the rollouts were
    sampled with, which are the weights prepare's pass would score. The PPO ratio is then exactly 1 (the separate
    pass gives 1 up to rounding), so the loss and its gradient are the separate pass's. What prepare logs of its
    pass (`actor/entropy`, `rollout/logprob_gap`) comes from the same scores, computed as prepare does over the same
    rows."""

    def __init__(self) -> None:
        self.logprobs: list[torch.Tensor] = []
        self.entropy: list[torch.Tensor] = []

    def old_logprobs(self, scored: LogProbs) -> torch.Tensor:
        """The old log-probs of a real micro-batch the policy scored as `scored` (with its entropy), kept per
        micro-batch for `metrics`."""
        self.logprobs.append(scored.logprobs.detach())
        self.entropy.append(scored.entropy.detach())
        return self.logprobs[-1]

    def metrics(self, minibatch: dict[str, torch.Tensor], logprob_gap: LogprobGap) -> dict[str, float]:
        """`actor/entropy` and `rollout/logprob_gap` of `minibatch`, whose micro-batches `old_logprobs` saw."""
        mask = minibatch["loss_mask"]
        old_logprobs, entropy = (merge_micro_batches(parts, minibatch) for parts in (self.logprobs, self.entropy))
        return {
            "actor/entropy": masked_mean(entropy, mask),
            "rollout/logprob_gap": logprob_gap(minibatch["sample_logprobs"], old_logprobs, mask),
        }


def minibatch_totals(mask: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The loss normalisers of a mini-batch whose rows on this rank have `mask` [B, T] (zero rows: none): its tokens
    and sequences summed over all ranks, so that gradients are summed over ranks. With several ranks also how many
    more tokens the busiest rank trains than the mean (every rank waits for it at the gradient sum), else None."""
    num_tokens, num_seqs = dist_utils.sum_over_ranks(torch.stack([mask.sum(), mask.any(-1).sum()]))
    totals = {"num_tokens": num_tokens.clamp(min=1), "num_seqs": num_seqs.clamp(min=1)}
    if not dist_utils.is_distributed():
        return totals, None
    busiest = dist_utils.tensor_max_over_ranks(mask.sum())
    return totals, busiest * dist_utils.rank_and_world()[1] / totals["num_tokens"]


def optimizer_step(optimizer, model: torch.nn.Module, name: str, *, clip: float, sharded: bool) -> dict[str, object]:
    """Sum the gradients over data-parallel ranks (FSDP's reduce-scatter has summed them already), clip their global
    norm (`clip` 0: no clipping), step and zero them. Returns the stats to record: `<name>/grad_norm`, and with
    several unsharded ranks `time/gradient_sum_s` before it."""
    stats = {}
    if not sharded and dist_utils.is_distributed():
        # a rank without rows adds zeros. Timed from this rank's last backward: the wait for the slowest rank, then
        # the all-reduce.
        device = next(model.parameters()).device
        _synchronize(device)
        start = time.perf_counter()
        dist_utils.sum_gradients(model)
        _synchronize(device)
        stats["time/gradient_sum_s"] = time.perf_counter() - start
    params = [p for p in model.parameters() if p.grad is not None]
    # with FSDP the gradients are DTensor shards and this is the global norm (a collective)
    norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
    if sharded:
        from ragen_lit.parallel.fsdp import full_tensor

        norm = full_tensor(norm)
    stats[f"{name}/grad_norm"] = norm
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return stats


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
