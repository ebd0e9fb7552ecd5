"""`AgentRLModule`: policy (+ critic, + frozen reference) and the PPO-family update, manual optimisation.

The algorithm lives in `ragen_lit.algos` (pure tensor functions); this class only wires it:
`prepare_batch` computes old/ref log-probs, values and advantages for one iteration's kept rollouts,
`training_step` runs one optimizer step of actor and critic on one mini-batch (split into micro-batches
whose losses add up exactly to the mini-batch loss).

Under `trainer.strategy=fsdp`, `configure_model` shards policy, critic and reference with FSDP2
(`ragen_lit.parallel.fsdp`). Every sharded forward/backward is then a collective, so all ranks must run the
same number of them although their kept rows differ (a rank may keep none):
`_lockstep_micro_batches` pads every rank's micro-batch count to the maximum over ranks with dummy
micro-batches whose loss is multiplied by 0 (exactly zero gradient). Rollouts and the MI cross-scorer
run an unknown, rank-dependent number of forwards and use `inference_policy()`, a full per-rank
replica of the policy refreshed from the shards after updates.
"""
from __future__ import annotations

import copy
import logging
import math
from collections import defaultdict

import lightning as L
import torch

from ragen_lit.parallel import collectives as dist_utils
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
from ragen_lit.training.batch import select_rows
from ragen_lit.config import Config
from ragen_lit.engines.vllm import mean_abs_logprob_diff
from ragen_lit.logprobs import token_logprobs
from ragen_lit.models import compile_layers, load_critic, load_policy, load_tokenizer
from ragen_lit.presets import resolve_model_path

log = logging.getLogger(__name__)
# Mean |log-prob| gap between engine and trainer above which a run warns once (bf16 noise is ~1e-2;
# the stale tied head of issue 18 gave 0.8).
LOGPROB_GAP_WARNING = 0.1


def _length_order(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Row indices sorted by sequence length, longest first (stable: ties keep their order)."""
    return torch.argsort(batch["attention_mask"].sum(-1), descending=True, stable=True)


def _micro_batches(batch: dict[str, torch.Tensor], size: int):
    """Micro-batches of `size` rows taken in `_length_order`, each cut to its longest row: rows of
    similar length share a micro-batch, so little compute goes to padding. Losses are normalised by
    the mini-batch totals, so how rows are grouped does not change the update."""
    order = _length_order(batch)
    lengths = batch["attention_mask"].sum(-1)[order].tolist()  # one wait for the device, not one per slice
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        part = {k: v[rows] for k, v in batch.items()}
        length = int(lengths[start])  # longest first: the slice's first row is its longest
        yield {k: (v[:, :length] if v.dim() == 2 else v) for k, v in part.items()}


def _zero_loss(output) -> torch.Tensor:
    """0 × (sum of every tensor in `output`): a loss on a lockstep dummy micro-batch whose backward gives
    every parameter used an exactly zero gradient."""
    tensors = [t for t in (output if isinstance(output, tuple) else (output,)) if torch.is_tensor(t)]
    return sum(t.sum() for t in tensors) * 0.0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


class AgentRLModule(L.LightningModule):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self._warned_logprob_gap = False
        self.automatic_optimization = False
        self.model_path = resolve_model_path(cfg.model)
        self.tokenizer = load_tokenizer(self.model_path)
        self.chat = ChatFormat(self.tokenizer)
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.policy = load_policy(self.model_path, cfg.model.dtype)
        if cfg.model.gradient_checkpointing:
            if cfg.trainer.strategy == "fsdp":  # FSDP2 composes with non-reentrant checkpointing only
                self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.policy.gradient_checkpointing_enable()
        self.critic = load_critic(cfg.model.critic_path or self.model_path, cfg.model.dtype) if uses_critic(cfg.algo.advantage) else None
        # the frozen reference is re-creatable from the weights on disk: keep it out of checkpoints
        self._reference = [self._frozen_copy()] if cfg.algo.kl_coef > 0 else []
        from ragen_lit.metrics.collapse import CollapseDiagnostics

        self.collapse = CollapseDiagnostics(cfg.diagnostics)
        self.empty_streak = 0
        self._step_stats: dict[str, list[float]] = defaultdict(list)
        self._configured = False  # `configure_model` ran (sharding and compilation happen once)
        # FSDP (set by `configure_model`): the sharded roots that score tokens (plain dict: not submodules),
        # the inference replica (a list: kept out of checkpoints) and the weight version it holds
        self._scorers: dict[int, torch.nn.Module] = {}
        self._inference: list[torch.nn.Module] = []
        self._policy_version = 0
        self._inference_version = -1

    def _frozen_copy(self):
        ref = copy.deepcopy(self.policy).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @property
    def reference(self):
        return self._reference[0] if self._reference else None

    # -- FSDP ---------------------------------------------------------------------------------------
    def configure_model(self):
        """Shard with FSDP2 when the strategy provides a device mesh (`trainer.strategy=fsdp`; DDP and
        single-device runs have none and nothing happens). Each decoder layer is a unit, then the root,
        for the policy, the critic and the frozen reference (sharded too: its forwards run in
        `prepare_batch`, in lockstep like the policy's, and a full copy per rank would cost the memory
        FSDP saves). Before sharding, the full inference replica is copied from the policy.
        Then, with `model.compile`, the policy's and critic's decoder layers are compiled (after every
        copy of the policy is made: see `compile_layers`)."""
        if self._configured:
            return
        if self.device_mesh is not None:
            self._shard()
        if self.cfg.model.compile:
            compile_layers(self.policy)
            if self.critic is not None:
                compile_layers(self.critic.backbone)
        self._configured = True

    def _shard(self):
        from ragen_lit.parallel import fsdp

        t = self.cfg.trainer
        mesh = self.device_mesh["data_parallel"]
        mp_policy = fsdp.mixed_precision(t.fsdp_param_dtype, t.fsdp_reduce_dtype)
        replica_dtype = fsdp.DTYPES[t.fsdp_param_dtype] if t.fsdp_param_dtype else None
        self._inference = [fsdp.inference_replica(self.policy, replica_dtype)]
        self._scorers[id(self.policy)] = fsdp.shard_causal_lm(self.policy, mesh, mp_policy)
        if self.reference is not None:
            self._scorers[id(self.reference)] = fsdp.shard_causal_lm(self.reference, mesh, mp_policy)
        if self.critic is not None:
            fsdp.shard_module(self.critic, mesh, mp_policy)

    @property
    def sharded(self) -> bool:
        """Whether FSDP shards the models (`_shard` ran and made the inference replica): every
        forward/backward on them is then collective (lockstep)."""
        return bool(self._inference)

    def inference_policy(self) -> torch.nn.Module:
        """The model rollouts and diagnostics run on: the policy itself, or under FSDP the full replica,
        first refreshed from the shards if the policy stepped since (a collective then: all ranks call
        this at the same points, and all take the same optimizer steps)."""
        if not self.sharded:
            return self.policy
        replica = self._inference[0]
        if next(replica.parameters()).device != self.device:  # made before the strategy moved the module
            replica.to(self.device)
        if self._inference_version != self._policy_version:
            from ragen_lit.parallel.fsdp import copy_full_weights

            copy_full_weights(self.policy, replica)
            self._inference_version = self._policy_version
        return replica

    def _lockstep_micro_batches(self, batch: dict[str, torch.Tensor] | None) -> list[tuple[dict[str, torch.Tensor], bool]]:
        """`(micro-batch, is_real)` pairs over `batch` (None or zero rows: this rank has nothing).

        Under FSDP the count is padded to the maximum over ranks with dummy micro-batches (one row of two
        pad tokens, the second scored), computed up front because the count itself is a collective
        that must come before any sharded forward. Callers run the same forwards on a dummy and
        backpropagate `_zero_loss` of their outputs: every parameter joins the reduce-scatter, with an
        exactly zero gradient."""
        size = self.cfg.optim.micro_batch_size
        real = list(_micro_batches(batch, size)) if batch is not None else []
        pairs = [(micro, True) for micro in real]
        if self.sharded:
            missing = dist_utils.max_over_ranks(len(real)) - len(real)
            if missing:
                dummy = self._dummy_micro_batch()
                pairs += [(dummy, False)] * missing
        return pairs

    def _dummy_micro_batch(self) -> dict[str, torch.Tensor]:
        ids = torch.full((1, 2), self.pad_token_id, dtype=torch.long, device=self.device)
        zeros = torch.zeros(1, 2, device=self.device)
        return {
            "input_ids": ids, "attention_mask": torch.ones(1, 2, dtype=torch.bool, device=self.device),
            "loss_mask": torch.tensor([[False, True]], device=self.device),
            **{k: zeros for k in ("old_logprobs", "ref_logprobs", "advantages", "values", "returns")},
        }

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
    def _logprob_gap(self, sample_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
        """`rollout/logprob_gap`: mean |engine log-prob − trainer log-prob| of the sampled tokens. Both
        score the same weights at the same temperature, so it is numerical noise (~1e-2 in bf16) unless
        the engine computes with weights the trainer no longer has (a partial or missed sync)."""
        gap = mean_abs_logprob_diff(sample_logprobs, old_logprobs, mask.bool())
        if gap > LOGPROB_GAP_WARNING and not self._warned_logprob_gap:
            log.warning(
                "rollout/logprob_gap=%.3f: the rollout engine (%s) and the trainer disagree on the sampled tokens' "
                "log-probs by more than %.2f; the engine may be computing with stale weights",
                gap, self.cfg.rollout.engine, LOGPROB_GAP_WARNING,
            )
            self._warned_logprob_gap = True
        return gap

    def _logprobs(self, model, batch, with_entropy=False):
        kwargs = {
            "temperature": self.cfg.rollout.temperature, "with_entropy": with_entropy, "score_mask": batch["loss_mask"],
            "compile_head": self.cfg.model.compile,
        }
        scorer = self._scorers.get(id(model))  # FSDP: the sharded root around `model` (see ragen_lit.parallel.fsdp)
        if scorer is not None:
            return scorer(batch["input_ids"], batch["attention_mask"], **kwargs)
        return token_logprobs(model, batch["input_ids"], batch["attention_mask"], **kwargs)

    @torch.no_grad()
    def prepare_batch(self, batch: dict[str, torch.Tensor] | None, keep_ratio: float) -> dict[str, float]:
        """Adds `old_logprobs`, `ref_logprobs`, `values`, `returns`, `advantages` to `batch` (in place,
        moved to this module's device) and returns iteration metrics. `batch=None`: this rank kept
        nothing; under FSDP it still joins the other ranks' sharded forwards, and returns no metrics."""
        a = self.cfg.algo
        if batch is not None:
            for k in list(batch):
                batch[k] = batch[k].to(self.device)
        parts = defaultdict(list)
        was_training = self.policy.training
        self.policy.eval()
        for micro, real in self._lockstep_micro_batches(batch):
            lp = self._logprobs(self.policy, micro, with_entropy=True)
            ref = self._logprobs(self.reference, micro).logprobs if self.reference is not None else None
            values = self.critic(micro["input_ids"], micro["attention_mask"]) if self.critic is not None else None
            if not real:
                continue
            pad = batch["input_ids"].shape[1] - micro["input_ids"].shape[1]
            parts["old_logprobs"].append(torch.nn.functional.pad(lp.logprobs, (0, pad)))
            parts["entropy"].append(torch.nn.functional.pad(lp.entropy, (0, pad)))
            if ref is not None:
                parts["ref_logprobs"].append(torch.nn.functional.pad(ref, (0, pad)))
            if values is not None:
                parts["values"].append(torch.nn.functional.pad(values, (0, pad)))
        self.policy.train(was_training)
        if self.sharded:
            from ragen_lit.parallel.fsdp import reshard

            for root in self._scorers.values():
                reshard(root)
            if self.critic is not None:
                reshard(self.critic)
        if batch is None:
            return {}
        mask = batch["loss_mask"]
        order = _length_order(batch)  # the row order the micro-batches took
        for k, v in parts.items():
            rows = torch.cat(v)
            batch[k] = torch.empty_like(rows).index_copy_(0, order, rows)
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
            "rollout/logprob_gap": self._logprob_gap(batch["sample_logprobs"], batch["old_logprobs"], mask),
            "actor/advantage_mean": _masked_mean(batch["advantages"], mask),
        }
        if self.critic is not None:
            metrics["critic/value_mean"] = _masked_mean(batch["values"], mask)
        return metrics

    def gradient_bucket_norms(self, batch: dict[str, torch.Tensor], row_bucket: torch.Tensor, num_buckets: int) -> dict[str, float]:
        """Paper Fig. 3: per reward-variance bucket, the gradient norm of the task (policy-gradient)
        loss and of the regulariser (entropy bonus + KL) on that bucket's rollouts. `batch` must be
        prepared (`prepare_batch`); no optimizer step is taken and gradients are cleared after.

        Without FSDP each rank reports the norm of its own rows' gradient (normalised by its own
        counts; the logged value is the mean over ranks). Under FSDP gradients are always summed over
        ranks, so the losses are normalised by the bucket's counts over all ranks and every rank
        reports the norm of the exact all-ranks bucket gradient."""
        a = self.cfg.algo
        out = {}
        local_rows = torch.stack([(row_bucket == b).sum() for b in range(num_buckets)])
        bucket_rows = dist_utils.sum_over_ranks(local_rows) if self.sharded else local_rows
        for bucket in range(num_buckets):
            if int(bucket_rows[bucket]) == 0:
                continue
            rows = (row_bucket == bucket).nonzero().flatten()
            sub = select_rows(batch, rows.to(batch["input_ids"].device))
            counts = torch.stack([sub["loss_mask"].sum(), sub["loss_mask"].any(-1).sum()])
            if self.sharded:
                counts = dist_utils.sum_over_ranks(counts)
            totals = {"num_tokens": counts[0], "num_seqs": counts[1], "norm_length": self.cfg.rollout.max_turns * self.cfg.rollout.max_new_tokens}
            for kind in ("task", "reg"):
                self.policy.zero_grad(set_to_none=True)
                for micro, real in self._lockstep_micro_batches(sub):
                    lp = self._logprobs(self.policy, micro, with_entropy=kind == "reg")
                    if not real:
                        _zero_loss(lp).backward()
                        continue
                    m = micro["loss_mask"]
                    if kind == "task":
                        loss = policy_loss(lp.logprobs, micro["old_logprobs"], micro["advantages"], m, clip_low=a.clip_low,
                                           clip_high=a.clip_high, dual_clip=a.dual_clip or None, loss_agg=a.loss_agg, **totals)[0]
                    else:
                        loss = -a.entropy_coef * aggregate_loss(lp.entropy, m, a.loss_agg, **totals)
                        if a.kl_coef > 0:
                            loss = loss + a.kl_coef * aggregate_loss(kl_penalty(lp.logprobs, micro["ref_logprobs"], a.kl_estimator), m, a.loss_agg, **totals)
                    loss.backward()
                params = [p for p in self.policy.parameters() if p.requires_grad]  # after backward: the sharded ones under FSDP
                if self.sharded:
                    from ragen_lit.parallel.fsdp import global_norm

                    out[f"grad/{kind}_norm/q{bucket + 1}"] = float(global_norm([p.grad.detach().float() for p in params if p.grad is not None]))
                    continue
                grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
                out[f"grad/{kind}_norm/q{bucket + 1}"] = float(torch.stack(grads).norm()) if grads else 0.0
        self.policy.zero_grad(set_to_none=True)
        return out

    def collapse_diagnostics(self, trajectories, iteration: int) -> dict[str, float]:
        return self.collapse.maybe_compute(self.inference_policy(), self.chat, trajectories, iteration, self.cfg.rollout.temperature)

    # -- the update -------------------------------------------------------------------------------
    def training_step(self, minibatch, batch_idx):
        has_rows = "empty" not in minibatch
        if int(dist_utils.sum_over_ranks(torch.tensor([int(has_rows)])).item()) == 0:
            return None  # no rank kept anything: this iteration makes no update
        if not has_rows:
            if self.sharded:  # the sharded update itself is collective: join it with dummy micro-batches
                self.update(None, *self._optimizers_and_schedulers())
            else:
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
        """One optimizer step of the actor (and critic) on one prepared mini-batch (None under FSDP: this
        rank has no rows and contributes zero gradients to the others' step)."""
        a = self.cfg.algo
        if minibatch is None:
            mask = torch.zeros(0, 1, dtype=torch.bool, device=self.device)
        else:
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
        for micro, real in self._lockstep_micro_batches(minibatch):
            lp = self._logprobs(self.policy, micro, with_entropy=a.entropy_coef > 0)
            if not real:
                self._backward(_zero_loss(lp))
                continue
            m = micro["loss_mask"]
            loss, stats = policy_loss(
                lp.logprobs, micro["old_logprobs"], micro["advantages"], m,
                clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip or None, loss_agg=a.loss_agg, **totals,
            )
            pg_total = pg_total + loss.detach()  # micro-batch losses add up to the mini-batch loss
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
        if minibatch is not None:
            self._record("actor/pg_loss", pg_total)
        self._step(actor_opt, self.policy, "actor")
        schedulers[0].step()
        if self.critic is not None:
            critic_opt = optimizers[1]
            value_total = 0.0
            for micro, real in self._lockstep_micro_batches(minibatch):
                values = self.critic(micro["input_ids"], micro["attention_mask"])
                if not real:
                    self._backward(_zero_loss(values))
                    continue
                loss, stats = value_loss(
                    values, micro["values"], micro["returns"], micro["loss_mask"],
                    clip=a.value_clip or None, loss_agg="token-mean", num_tokens=totals["num_tokens"],
                )
                value_total = value_total + loss.detach()
                for k, v in stats.items():
                    self._record(f"critic/{k}", v)
                self._backward(loss)
            if minibatch is not None:
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
        if not self.sharded:  # FSDP's reduce-scatter has summed them already
            dist_utils.sum_gradients(model)
        params = [p for p in model.parameters() if p.grad is not None]
        # with FSDP the gradients are DTensor shards and this is the global norm (a collective)
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        if self.sharded:
            from ragen_lit.parallel.fsdp import full_tensor

            norm = full_tensor(norm)
        self._record(f"{name}/grad_norm", norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if model is self.policy:
            self._policy_version += 1  # the inference replica is stale from now on

    def _record(self, key: str, value) -> None:
        # tensors stay on the device until `pop_step_stats`: a float() here would make the host wait
        # for every micro-batch's forward before it may queue the backward
        self._step_stats[key].append(value.detach() if torch.is_tensor(value) else float(value))

    def pop_step_stats(self) -> dict[str, float]:
        stats = {k: sum(float(x) for x in v) / len(v) for k, v in self._step_stats.items() if v}
        self._step_stats.clear()
        return stats

    # -- checkpoint extras --------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint):
        checkpoint["ragen_lit"] = {"empty_streak": self.empty_streak}

    def on_load_checkpoint(self, checkpoint):
        self.empty_streak = int(checkpoint.get("ragen_lit", {}).get("empty_streak", 0))
