"""`AgentRLModule`: policy (+ critic, + frozen reference) and the PPO-family update, manual optimisation.

The algorithm lives in `ragen_lit.algos` (pure tensor functions); this class only wires it:
`prepare_batch` computes old/ref log-probs, values and advantages for one iteration's kept rollouts,
`training_step` runs one optimizer step of actor and critic on one mini-batch (split into micro-batches
whose losses add up exactly to the mini-batch loss).
"""
from __future__ import annotations

import copy
import math
from collections import defaultdict

import lightning as L
import torch

from ragen_lit import distributed as dist_utils
from ragen_lit.agent.chat import ChatFormat
from ragen_lit.algos import (
    aggregate_loss,
    broadcast_to_tokens,
    gae,
    bilevel_gae,
    group_normalized_advantages,
    kl_penalty,
    policy_loss,
    rloo_advantages,
    scale_by_keep_rate,
    uses_critic,
    value_loss,
    whiten,
)
from ragen_lit.batch import select_rows
from ragen_lit.config import Config
from ragen_lit.logprobs import token_logprobs
from ragen_lit.models import load_critic, load_policy, load_tokenizer, resolve_model_path


def _micro_batches(batch: dict[str, torch.Tensor], size: int):
    n = batch["input_ids"].shape[0]
    for start in range(0, n, size):
        part = {k: v[start:start + size] for k, v in batch.items()}
        length = int(part["attention_mask"].sum(-1).max().item())
        yield {k: (v[:, :length] if v.dim() == 2 else v) for k, v in part.items()}


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


class AgentRLModule(L.LightningModule):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        self.model_path = resolve_model_path(cfg.model)
        self.tokenizer = load_tokenizer(self.model_path)
        self.chat = ChatFormat(self.tokenizer)
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.policy = load_policy(self.model_path, cfg.model.dtype)
        if cfg.model.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.critic = load_critic(cfg.model.critic_path or self.model_path, cfg.model.dtype) if uses_critic(cfg.algo.advantage) else None
        # the frozen reference is re-creatable from the weights on disk: keep it out of checkpoints
        self._reference = [self._frozen_copy()] if cfg.algo.kl_coef > 0 else []
        from ragen_lit.diagnostics import CollapseDiagnostics

        self.collapse = CollapseDiagnostics(cfg.diagnostics)
        self.empty_streak = 0
        self._step_stats: dict[str, list[float]] = defaultdict(list)

    def _frozen_copy(self):
        ref = copy.deepcopy(self.policy).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @property
    def reference(self):
        return self._reference[0] if self._reference else None

    def on_fit_start(self):
        if self.reference is not None:
            self._reference[0] = self.reference.to(self.device)

    # -- optimisers -------------------------------------------------------------------------------
    def configure_optimizers(self):
        o = self.cfg.optim
        def warmup(step: int) -> float:
            return min(1.0, (step + 1) / o.warmup_steps) if o.warmup_steps else 1.0
        actor = torch.optim.AdamW(self.policy.parameters(), lr=o.actor_lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        optimizers, schedulers = [actor], [torch.optim.lr_scheduler.LambdaLR(actor, warmup)]
        if self.critic is not None:
            critic = torch.optim.AdamW(self.critic.parameters(), lr=o.critic_lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
            optimizers.append(critic)
            schedulers.append(torch.optim.lr_scheduler.LambdaLR(critic, warmup))
        return optimizers, schedulers

    # -- per-iteration preparation --------------------------------------------------------------
    def _logprobs(self, model, batch, with_entropy=False):
        return token_logprobs(
            model, batch["input_ids"], batch["attention_mask"],
            temperature=self.cfg.rollout.temperature, with_entropy=with_entropy, score_mask=batch["loss_mask"],
        )

    @torch.no_grad()
    def prepare_batch(self, batch: dict[str, torch.Tensor], keep_ratio: float) -> dict[str, float]:
        """Adds `old_logprobs`, `ref_logprobs`, `values`, `returns`, `advantages` to `batch` (in place,
        moved to this module's device) and returns iteration metrics."""
        a = self.cfg.algo
        for k in list(batch):
            batch[k] = batch[k].to(self.device)
        mask = batch["loss_mask"]
        parts = defaultdict(list)
        was_training = self.policy.training
        self.policy.eval()
        for micro in _micro_batches(batch, self.cfg.optim.micro_batch_size):
            pad = batch["input_ids"].shape[1] - micro["input_ids"].shape[1]
            lp = self._logprobs(self.policy, micro, with_entropy=True)
            parts["old_logprobs"].append(torch.nn.functional.pad(lp.logprobs, (0, pad)))
            parts["entropy"].append(torch.nn.functional.pad(lp.entropy, (0, pad)))
            if self.reference is not None:
                parts["ref_logprobs"].append(torch.nn.functional.pad(self._logprobs(self.reference, micro).logprobs, (0, pad)))
            if self.critic is not None:
                parts["values"].append(torch.nn.functional.pad(self.critic(micro["input_ids"], micro["attention_mask"]), (0, pad)))
        self.policy.train(was_training)
        for k, v in parts.items():
            batch[k] = torch.cat(v)
        entropy = batch.pop("entropy")
        if a.advantage in ("gae", "bilevel_gae"):
            if a.advantage == "gae":
                advantages, returns = gae(batch["token_rewards"], batch["values"], mask, gamma=a.gamma, lam=a.lam)
            else:
                advantages, returns = bilevel_gae(
                    batch["token_rewards"], batch["values"], mask, batch["turn_end_mask"],
                    gamma=a.gamma, lam=a.lam, high_level_gamma=a.high_level_gamma,
                )
            if a.whiten_advantages:
                advantages = whiten(advantages, mask)
            batch["returns"] = returns
        else:
            if a.advantage == "rloo":
                seq_adv = rloo_advantages(batch["scores"], batch["group_ids"])
            else:
                seq_adv = group_normalized_advantages(batch["scores"], batch["group_ids"], std_normalize=a.advantage == "grpo")
            advantages = broadcast_to_tokens(seq_adv, mask)
        batch["advantages"] = scale_by_keep_rate(advantages, keep_ratio, self.cfg.filter.advantage_scaling)
        metrics = {
            "actor/entropy": _masked_mean(entropy, mask),
            "actor/sampling_logprob_mismatch": _masked_mean((batch["sample_logprobs"] - batch["old_logprobs"]).abs(), mask),
            "actor/advantage_mean": _masked_mean(batch["advantages"], mask),
        }
        if self.critic is not None:
            metrics["critic/value_mean"] = _masked_mean(batch["values"], mask)
        return metrics

    def gradient_bucket_norms(self, batch: dict[str, torch.Tensor], row_bucket: torch.Tensor, num_buckets: int) -> dict[str, float]:
        """Paper Fig. 3: per reward-variance bucket, the gradient norm of the task (policy-gradient)
        loss and of the regulariser (entropy bonus + KL) on that bucket's rollouts. `batch` must be
        prepared (`prepare_batch`); no optimizer step is taken and gradients are cleared after."""
        a = self.cfg.algo
        out = {}
        params = [p for p in self.policy.parameters() if p.requires_grad]
        for bucket in range(num_buckets):
            rows = (row_bucket == bucket).nonzero().flatten()
            if rows.numel() == 0:
                continue
            sub = select_rows(batch, rows.to(batch["input_ids"].device))
            totals = {"num_tokens": sub["loss_mask"].sum(), "num_seqs": sub["loss_mask"].any(-1).sum(), "norm_length": self.cfg.rollout.max_turns * self.cfg.rollout.max_new_tokens}
            for kind in ("task", "reg"):
                self.policy.zero_grad(set_to_none=True)
                for micro in _micro_batches(sub, self.cfg.optim.micro_batch_size):
                    lp = self._logprobs(self.policy, micro, with_entropy=kind == "reg")
                    m = micro["loss_mask"]
                    if kind == "task":
                        loss = policy_loss(lp.logprobs, micro["old_logprobs"], micro["advantages"], m, clip_low=a.clip_low,
                                           clip_high=a.clip_high, dual_clip=a.dual_clip or None, loss_agg=a.loss_agg, **totals)[0]
                    else:
                        loss = -a.entropy_coef * aggregate_loss(lp.entropy, m, a.loss_agg, **totals)
                        if a.kl_coef > 0:
                            loss = loss + a.kl_coef * aggregate_loss(kl_penalty(lp.logprobs, micro["ref_logprobs"], a.kl_estimator), m, a.loss_agg, **totals)
                    loss.backward()
                grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
                out[f"grad/{kind}_norm/q{bucket + 1}"] = float(torch.stack(grads).norm()) if grads else 0.0
        self.policy.zero_grad(set_to_none=True)
        return out

    def collapse_diagnostics(self, trajectories, iteration: int) -> dict[str, float]:
        return self.collapse.maybe_compute(self.policy, self.chat, trajectories, iteration, self.cfg.rollout.temperature)

    # -- the update -------------------------------------------------------------------------------
    def training_step(self, minibatch, batch_idx):
        has_rows = "empty" not in minibatch
        if int(dist_utils.sum_over_ranks(torch.tensor([int(has_rows)])).item()) == 0:
            return None  # no rank kept anything: this iteration makes no update
        if not has_rows:
            self._empty_rank_step()
            return None
        self.update(minibatch, *self._optimizers_and_schedulers())
        return None

    def _optimizers_and_schedulers(self):
        optimizers = self.optimizers()
        schedulers = self.lr_schedulers()
        return (optimizers if isinstance(optimizers, list) else [optimizers],
                schedulers if isinstance(schedulers, list) else [schedulers])

    def _backward(self, loss: torch.Tensor) -> None:
        if self._trainer is not None:
            self.manual_backward(loss)
        else:  # used outside a Trainer (benchmarks): plain autograd
            loss.backward()

    def update(self, minibatch, optimizers, schedulers) -> None:
        """One optimizer step of the actor (and critic) on one prepared mini-batch."""
        a, o = self.cfg.algo, self.cfg.optim
        mask = minibatch["loss_mask"]
        # normalise by the mini-batch totals over all ranks: gradients are then *summed* over ranks
        num_tokens, num_seqs = dist_utils.sum_over_ranks(torch.stack([mask.sum(), mask.any(-1).sum()]))
        totals = {
            "num_tokens": num_tokens.clamp(min=1),
            "num_seqs": num_seqs.clamp(min=1),
            "norm_length": self.cfg.rollout.max_turns * self.cfg.rollout.max_new_tokens,
        }
        actor_opt = optimizers[0]
        pg_total = 0.0
        for micro in _micro_batches(minibatch, o.micro_batch_size):
            lp = self._logprobs(self.policy, micro, with_entropy=a.entropy_coef > 0)
            m = micro["loss_mask"]
            loss, stats = policy_loss(
                lp.logprobs, micro["old_logprobs"], micro["advantages"], m,
                clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip or None, loss_agg=a.loss_agg, **totals,
            )
            pg_total += float(loss.detach())  # micro-batch losses add up to the mini-batch loss
            for k, v in stats.items():
                self._record(f"actor/{k}", v)
            if a.entropy_coef > 0:
                entropy = aggregate_loss(lp.entropy, m, a.loss_agg, **totals)
                loss = loss - a.entropy_coef * entropy
            if a.kl_coef > 0:
                kl = aggregate_loss(kl_penalty(lp.logprobs, micro["ref_logprobs"], a.kl_estimator), m, a.loss_agg, **totals)
                self._record("actor/kl", kl)
                loss = loss + a.kl_coef * kl
            self._backward(loss)
        self._record("actor/pg_loss", pg_total)
        self._step(actor_opt, self.policy, "actor")
        schedulers[0].step()
        if self.critic is not None:
            critic_opt = optimizers[1]
            value_total = 0.0
            for micro in _micro_batches(minibatch, o.micro_batch_size):
                values = self.critic(micro["input_ids"], micro["attention_mask"])
                loss, stats = value_loss(
                    values, micro["values"], micro["returns"], micro["loss_mask"],
                    clip=a.value_clip or None, loss_agg="token-mean", num_tokens=totals["num_tokens"],
                )
                value_total += float(loss.detach())
                for k, v in stats.items():
                    self._record(f"critic/{k}", v)
                self._backward(loss)
            self._record("critic/value_loss", value_total)
            self._step(critic_opt, self.critic, "critic")
            schedulers[1].step()

    def _empty_rank_step(self):
        """This rank kept no rollouts for this mini-batch but others did: join their gradient sum with
        zero gradients and take the same optimizer step, so the replicas stay identical."""
        optimizers, schedulers = self._optimizers_and_schedulers()
        dist_utils.sum_over_ranks(torch.zeros(2, dtype=torch.long))  # the totals collective of training_step
        models = [self.policy] + ([self.critic] if self.critic is not None else [])
        for optimizer, scheduler, model, name in zip(optimizers, schedulers, models, ("actor", "critic")):
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
            self._step(optimizer, model, name)
            scheduler.step()

    def _step(self, optimizer, model, name: str):
        clip = self.cfg.optim.grad_clip
        dist_utils.sum_gradients(model)
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        self._record(f"{name}/grad_norm", norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _record(self, key: str, value) -> None:
        self._step_stats[key].append(float(value.detach()) if torch.is_tensor(value) else float(value))

    def pop_step_stats(self) -> dict[str, float]:
        stats = {k: sum(v) / len(v) for k, v in self._step_stats.items() if v}
        self._step_stats.clear()
        return stats

    # -- checkpoint extras --------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint):
        checkpoint["ragen_lit"] = {"empty_streak": self.empty_streak}

    def on_load_checkpoint(self, checkpoint):
        self.empty_streak = int(checkpoint.get("ragen_lit", {}).get("empty_streak", 0))
