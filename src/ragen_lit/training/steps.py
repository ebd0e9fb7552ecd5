"""One optimizer step's backward passes, actor then critic, over a mini-batch's micro-batches: functions that take the
passes they run (`score`, `values`, `backward`, `record`), so that `AgentRLModule.update` only wires them.

Every micro-batch's loss is normalised by the mini-batch totals over all ranks (`totals`), so the micro-batch losses
add up to the mini-batch loss and gradients are summed over ranks. A lock-step dummy (`real` False: this rank has no
rows where another still runs a sharded forward) backpropagates a zero loss and records nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch

from ragen_lit.algos import actor_loss, value_loss
from ragen_lit.config import Config
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.parallel.lockstep import zero_loss
from ragen_lit.training.batch import merge_micro_batches
from ragen_lit.training.prepare import masked_mean

MicroBatches = Iterable[tuple[dict[str, torch.Tensor], bool]]
Record = Callable[[str, object], None]


def loss_settings(cfg: Config) -> dict:
    """`actor_loss`'s settings from `algo.*`; Dr.GRPO's constant length is the whole response budget."""
    a, r = cfg.algo, cfg.rollout
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


def actor_backward(
    micros: MicroBatches,
    score: Callable,
    backward: Callable[[torch.Tensor], None],
    record: Record,
    *,
    settings: dict,
    totals: dict[str, torch.Tensor],
    from_update: bool,
    entropy_bonus: bool,
) -> dict[str, list[torch.Tensor]]:
    """The actor's backward over `micros`: `score(micro, with_entropy)` gives the policy's log-probs (`LogProbs`).
    Records the mini-batch's policy loss (the micro-batch losses' sum) as `actor/pg_loss`. With `from_update` the
    detached log-probs serve as the old ones (the iteration's one optimizer step) and are returned per micro-batch
    with the entropy, what prepare would have scored (`record_old_policy`); otherwise {}."""
    pg_total, any_real = 0.0, False
    scored: dict[str, list[torch.Tensor]] = {"old_logprobs": [], "entropy": []}
    for micro, real in micros:
        lp = score(micro, entropy_bonus or from_update)
        if not real:
            backward(zero_loss(lp))
            continue
        any_real = True
        if from_update:
            old_logprobs = lp.logprobs.detach()
            scored["old_logprobs"].append(old_logprobs)
            scored["entropy"].append(lp.entropy.detach())
        else:
            old_logprobs = micro["old_logprobs"]
        loss, stats = actor_loss(
            lp.logprobs,
            micro["loss_mask"],
            old_logprobs=old_logprobs,
            advantages=micro["advantages"],
            entropy=lp.entropy if entropy_bonus else None,
            ref_logprobs=micro.get("ref_logprobs"),
            **settings,
            **totals,
        )
        pg_total = pg_total + stats.pop("pg_loss")  # micro-batch losses add up to the mini-batch loss
        for k, v in stats.items():
            record(f"actor/{k}", v)
        backward(loss)
    if any_real:
        record("actor/pg_loss", pg_total)
    return scored if scored["old_logprobs"] else {}


def record_old_policy(
    scored: dict[str, list[torch.Tensor]], minibatch: dict[str, torch.Tensor], record: Record, logprob_gap: Callable
) -> None:
    """What prepare logs when it scores the old policy (`actor/entropy`, `rollout/logprob_gap`), from the update's own
    scores (`actor_backward`'s), computed as prepare does over the same rows."""
    mask = minibatch["loss_mask"]
    old_logprobs, entropy = (merge_micro_batches(scored[k], minibatch) for k in ("old_logprobs", "entropy"))
    record("actor/entropy", masked_mean(entropy, mask))
    record("rollout/logprob_gap", logprob_gap(minibatch["sample_logprobs"], old_logprobs, mask))


def critic_backward(
    micros: MicroBatches,
    values: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    record: Record,
    *,
    clip: float | None,
    num_tokens: torch.Tensor,
) -> None:
    """The critic's backward over `micros` (the actor's): clipped value loss, token-mean over the mini-batch's
    tokens; records the mini-batch's value loss as `critic/value_loss`."""
    value_total, any_real = 0.0, False
    for micro, real in micros:
        predicted = values(micro)
        if not real:
            backward(zero_loss(predicted))
            continue
        any_real = True
        loss, stats = value_loss(
            predicted,
            micro["values"],
            micro["returns"],
            micro["loss_mask"],
            clip=clip,
            loss_agg="token-mean",
            num_tokens=num_tokens,
        )
        value_total = value_total + loss.detach()
        for k, v in stats.items():
            record(f"critic/{k}", v)
        backward(loss)
    if any_real:
        record("critic/value_loss", value_total)


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
