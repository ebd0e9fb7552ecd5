"""Paper Fig. 3: the gradient norm of the task loss and of the regulariser, per reward-variance bucket.

Groups are ranked by their reward-variance score and cut into `NUM_BUCKETS` buckets (`row_buckets`);
on each bucket's rollouts the policy's gradient is computed twice, once for the task (policy-gradient)
loss and once for the regulariser (entropy bonus + KL penalty), both via `algos.actor_loss`, and its
norm is reported as `grad/task_norm/q{b}` and `grad/reg_norm/q{b}`, and the bucket's mean reward-variance
score as `grad/rv/q{b}` (the figure's x-axis). b = 1 is `rv_buckets`' bucket 0, the lowest reward variance:
q1 → q6 ascend, as the paper's Q1 → Q6.
No optimizer step is taken and the gradients are cleared after. The caller provides the model-side
pieces (how a micro-batch is scored, how a bucket's rows become lock-step micro-batches), so this
module needs no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ragen_lit.algos import actor_loss
from ragen_lit.filtering import reward_variance_scores, rv_buckets
from ragen_lit.parallel import collectives
from ragen_lit.parallel.lockstep import zero_loss

NUM_BUCKETS = 6


def row_buckets(rewards: torch.Tensor, score: str, num_buckets: int = NUM_BUCKETS) -> torch.Tensor:
    """Each rollout's bucket: its group's rank by reward-variance `score` (`filter.score`), ascending
    (bucket 0 the lowest), in at most `num_buckets` buckets (fewer when there are fewer groups).

    rewards: [G, K] (G groups of K rollouts, rows in that order) -> [G·K] long."""
    group_bucket = rv_buckets(reward_variance_scores(rewards, score), min(num_buckets, rewards.shape[0]))
    return group_bucket.repeat_interleave(rewards.shape[1])


def bucket_reward_variance(rewards: torch.Tensor, score: str, num_buckets: int = NUM_BUCKETS) -> dict[str, float]:
    """`grad/rv/q{b}`: the mean reward-variance score (`filter.score`) of the groups in bucket b of `row_buckets`,
    RV_b = (1 / |G_b|) Σ_{g ∈ G_b} score_g, for every bucket that holds a group.

    rewards: [G, K] -> {"grad/rv/q1": RV_1, ...}, ascending in b."""
    scores = reward_variance_scores(rewards, score)
    group_bucket = rv_buckets(scores, min(num_buckets, rewards.shape[0]))
    return {f"grad/rv/q{b + 1}": float(scores[group_bucket == b].mean()) for b in range(int(group_bucket.max()) + 1)}


def gradient_bucket_norms(
    policy: nn.Module,
    loss_mask: torch.Tensor,
    row_bucket: torch.Tensor,
    num_buckets: int,
    *,
    micro_batches: Callable[[torch.Tensor], list[tuple[dict[str, torch.Tensor], bool]]],
    score: Callable[[dict[str, torch.Tensor], bool], tuple],
    loss_settings: dict,
    sharded: bool,
) -> dict[str, float]:
    """`grad/task_norm/q{b}` and `grad/reg_norm/q{b}` for every bucket b that has rows on some rank.

    policy: the model whose gradients are measured; loss_mask: [B, T] bool of the prepared batch;
    row_bucket: [B] long, each row's bucket; micro_batches(rows): the `(micro-batch, is_real)` pairs of
    the batch's rows `rows` (lock-step under FSDP, see `parallel.lockstep`); score(micro, with_entropy):
    the policy's `LogProbs` on a micro-batch; loss_settings: `actor_loss` keyword settings, with
    `norm_length`.

    Without FSDP each rank reports the norm of its own rows' gradient (normalised by its own counts; the
    logged value is the mean over ranks). Under FSDP (`sharded`) gradients are always summed over ranks,
    so the losses are normalised by the bucket's counts over all ranks and every rank reports the norm
    of the exact all-ranks bucket gradient."""
    out = {}
    local_rows = torch.stack([(row_bucket == b).sum() for b in range(num_buckets)])
    bucket_rows = collectives.sum_over_ranks(local_rows) if sharded else local_rows
    task_settings = {**loss_settings, "kl_coef": 0.0}
    for bucket in range(num_buckets):
        if int(bucket_rows[bucket]) == 0:
            continue
        rows = (row_bucket == bucket).nonzero().flatten().to(loss_mask.device)
        mask = loss_mask[rows]
        counts = torch.stack([mask.sum(), mask.any(-1).sum()])
        if sharded:
            counts = collectives.sum_over_ranks(counts)
        totals = {"num_tokens": counts[0], "num_seqs": counts[1]}
        for kind in ("task", "reg"):
            policy.zero_grad(set_to_none=True)
            for micro, real in micro_batches(rows):
                lp = score(micro, kind == "reg")
                if not real:
                    zero_loss(lp).backward()
                    continue
                if kind == "task":
                    loss = actor_loss(
                        lp.logprobs,
                        micro["loss_mask"],
                        old_logprobs=micro["old_logprobs"],
                        advantages=micro["advantages"],
                        **task_settings,
                        **totals,
                    )[0]
                else:
                    loss = actor_loss(
                        lp.logprobs,
                        micro["loss_mask"],
                        entropy=lp.entropy,
                        ref_logprobs=micro.get("ref_logprobs"),
                        **loss_settings,
                        **totals,
                    )[0]
                loss.backward()
            out[f"grad/{kind}_norm/q{bucket + 1}"] = _gradient_norm(policy, sharded)
    policy.zero_grad(set_to_none=True)
    return out


def _gradient_norm(model: nn.Module, sharded: bool) -> float:
    """The 2-norm of `model`'s gradient; under FSDP of the full gradient over all ranks' shards (a collective)."""
    params = [p for p in model.parameters() if p.requires_grad]  # after backward: the sharded ones under FSDP
    if sharded:
        from ragen_lit.parallel.fsdp import global_norm

        return float(global_norm([p.grad.detach().float() for p in params if p.grad is not None]))
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0
