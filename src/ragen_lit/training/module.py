"""`AgentRLModule`: policy (+ critic, + frozen reference) and the PPO-family update, manual optimisation.

With `model.lora.r > 0` the policy and the critic's backbone carry peft adapters and only those (and the value
head) train; the KL reference is the policy with its adapters disabled, and checkpoints leave the frozen base
weights out.

The algorithm lives in `ragen_lit.algos` (pure tensor functions); this class wires it to Lightning:
`prepare_batch` computes old/ref log-probs, values and advantages for one iteration's kept rollouts,
`training_step` runs one optimizer step of actor and critic on one mini-batch (split into micro-batches
whose losses add up exactly to the mini-batch loss; every backward goes through `manual_backward`).
What `RolloutDataModule` uses of it is listed in `ragen_lit.training.data.RolloutModule`.

Under `trainer.strategy=fsdp`, `configure_model` shards policy, critic and reference with FSDP2
(`ragen_lit.parallel.fsdp`); every sharded forward/backward then runs in lock-step over the ranks
(`ragen_lit.parallel.lockstep`). Rollouts and the MI cross-scorer run an unknown, rank-dependent number
of forwards and use `inference_policy()`, a full per-rank replica of the policy refreshed from the
shards after updates.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import defaultdict

import lightning as L
import torch

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.algos import (
    actor_loss,
    anchored_step_fraction,
    estimate_advantages,
    scale_by_keep_rate,
    value_loss,
)
from ragen_lit.config import Config
from ragen_lit.errors import ConfigError
from ragen_lit.logprobs import HostMasks, mean_abs_logprob_diff, token_logprobs
from ragen_lit.metrics.collapse import CollapseDiagnostics
from ragen_lit.metrics.gradient_buckets import NUM_BUCKETS, bucket_reward_variance, gradient_bucket_norms, row_buckets
from ragen_lit.models import compile_layers, load_tokenizer, resolve_compile
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.parallel.lockstep import lockstep, zero_loss
from ragen_lit.parallel.sharded import ShardedModels
from ragen_lit.presets import resolve_model_path
from ragen_lit.training.batch import (
    collate,
    merge_micro_batches,
    micro_batch_rows,
    micro_batches,
    pad_multiple,
    select_rows,
)
from ragen_lit.training.build_models import build_models
from ragen_lit.training.gpu_memory import cap_process_memory
from ragen_lit.training.optimizers import build_optimizers, warn_stalled_updates

log = logging.getLogger(__name__)
# Mean |log-prob| gap between engine and trainer above which a run warns once (bf16 noise is ~1e-2;
# the stale tied head of issue 18 gave 0.8).
LOGPROB_GAP_WARNING = 0.1


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def _no_rows(device: torch.device) -> dict[str, torch.Tensor]:
    """An empty batch (no rows, one token position) with the keys `estimate_advantages` reads."""
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
        lora = cfg.model.lora
        self.policy, self.critic = build_models(cfg, self.model_path)
        if lora.r > 0:
            # checkpoints leave the frozen base weights out (`on_save_checkpoint`); `on_load_checkpoint` checks the rest
            self.strict_loading = False
        # the frozen reference is re-creatable from the weights on disk: keep it out of checkpoints. Under LoRA the
        # reference is the policy with its adapters disabled (`_reference_logprobs`): no copy at all
        self._reference = [self._frozen_copy()] if cfg.algo.kl_coef > 0 and lora.r == 0 else []
        self.collapse = CollapseDiagnostics(cfg.diagnostics)
        self._step_stats: dict[str, list[float]] = defaultdict(list)
        self._configured = False  # `configure_model` ran (sharding and compilation happen once)
        self._fsdp: ShardedModels | None = None  # set by `configure_model` under FSDP (a plain object: not a submodule)
        self._policy_version = 0  # optimizer steps of the policy: the inference replica follows it

    def _frozen_copy(self):
        ref = copy.deepcopy(self.policy).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @property
    def reference(self):
        """The frozen copy of the policy (`algo.kl_coef > 0` without LoRA), else None."""
        return self._reference[0] if self._reference else None

    def _reference_logprobs(self, micro: dict[str, torch.Tensor]) -> torch.Tensor:
        """The KL reference's log-probs of `micro`: the frozen copy's, or under LoRA the policy's own with its
        adapters disabled (the base weights the run started from)."""
        if self.reference is not None:
            return self._logprobs(self.reference, micro).logprobs
        with self.policy.disable_adapter():
            return self._logprobs(self.policy, micro).logprobs

    # -- checkpoints ---------------------------------------------------------------------------------
    def _frozen_keys(self) -> set[str]:
        """State-dict keys of the parameters no optimizer steps (under LoRA the base weights, tied ones included)."""
        return {name for name, p in self.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint holds what training changes: the frozen base weights of a LoRA run are `model.path`'s."""
        frozen = self._frozen_keys()
        if frozen:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k not in frozen}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Loading is not strict under LoRA (the frozen weights are absent): check here that exactly the others are
        present, so that a resume restores every trained tensor or stops with one line."""
        frozen = self._frozen_keys()
        if not frozen:
            return
        expected, found = set(self.state_dict()) - frozen, set(checkpoint["state_dict"])
        if found != expected:
            missing, unexpected = sorted(expected - found), sorted(found - expected)
            raise ConfigError(
                f"trainer.resume: the checkpoint does not hold this run's trainable weights (model.lora.r="
                f"{self.cfg.model.lora.r}): missing {missing[:3]}, unexpected {unexpected[:3]}; resume with the "
                "run's own model.lora settings"
            )

    # -- FSDP ---------------------------------------------------------------------------------------
    def configure_model(self):
        """Shard with FSDP2 when the strategy provides a device mesh (`trainer.strategy=fsdp`; DDP and
        single-device runs have none and nothing happens): policy, frozen reference and critic, after the
        full inference replica is copied from the policy (`parallel.sharded`). Then, with `model.compile`,
        the policy's and critic's decoder layers are compiled (after every copy of the policy is made: see
        `compile_layers`)."""
        if self._configured:
            return
        if self.device_mesh is not None:
            t = self.cfg.trainer
            self._fsdp = ShardedModels(
                self.policy,
                self.reference,
                self.critic,
                self.device_mesh["data_parallel"],
                t.fsdp_param_dtype,
                t.fsdp_reduce_dtype,
            )
        if self.compiled:
            compile_layers(self.policy)
            if self.critic is not None:
                compile_layers(self.critic.backbone)
        self._configured = True

    @property
    def compiled(self) -> bool:
        """`model.compile` as it resolves for this run (null: on where a GPU is used)."""
        return resolve_compile(self.cfg.model.compile, self.cfg.trainer.accelerator)

    @property
    def sharded(self) -> bool:
        """Whether FSDP shards the models: every forward/backward on them is then collective (lock-step)."""
        return self._fsdp is not None

    def inference_policy(self) -> torch.nn.Module:
        """The model rollouts and diagnostics run on: the policy itself, or under FSDP the full replica,
        refreshed from the shards if the policy stepped since (`ShardedModels.inference_policy`)."""
        if not self.sharded:
            return self.policy
        return self._fsdp.inference_policy(self.device, self._policy_version)

    @property
    def _pad_multiple(self) -> int:
        o = self.cfg.optim
        return pad_multiple(o.pad_to_multiple, o.padding_free, self.device)

    def _micro_batches(self, batch: dict[str, torch.Tensor] | None) -> list[tuple[dict[str, torch.Tensor], bool]]:
        """`(micro-batch, is_real)` pairs over `batch` (None or zero rows: this rank has nothing), padded
        with dummies to the busiest rank's count under FSDP (`parallel.lockstep`)."""
        o = self.cfg.optim
        real = (
            ()
            if batch is None
            else micro_batches(
                batch,
                micro_batch_rows(o.micro_batch_size, self.device),
                o.micro_batch_tokens,
                o.padding_free,
                self._pad_multiple,
            )
        )
        return lockstep(real, sharded=self.sharded, pad_token_id=self.pad_token_id, device=self.device)

    def on_fit_start(self):
        cap_process_memory(self.device, self.cfg.trainer.gpu_memory_fraction)
        if self.reference is not None:
            self._reference[0] = self.reference.to(self.device)

    # -- optimisers -------------------------------------------------------------------------------
    def configure_optimizers(self):
        planned_steps = self.cfg.trainer.iterations * self.cfg.algo.ppo_epochs * self.cfg.optim.num_minibatches
        if self.global_rank == 0:
            warn_stalled_updates(self.cfg.optim, self.policy, self.critic)
        return build_optimizers(self.cfg.optim, planned_steps, self.policy, self.critic)

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
                gap,
                self.cfg.rollout.engine,
                LOGPROB_GAP_WARNING,
            )
            self._warned_logprob_gap = True
        return gap

    def _logprobs(self, model, batch, with_entropy=False):
        kwargs = {
            "temperature": self.cfg.rollout.temperature,
            "with_entropy": with_entropy,
            "score_mask": batch["loss_mask"],
            "compile_head": self.compiled,
            "packed": self.cfg.optim.padding_free,
        }
        if "host_attention_mask" in batch:  # a micro-batch's CPU copies: the forward need not wait for the device
            kwargs["host_masks"] = HostMasks(batch["host_attention_mask"], batch.get("host_loss_mask"))
        scorer = self._fsdp.scorer(model) if self.sharded else None  # FSDP: the sharded root around `model`
        if scorer is not None:
            return scorer(batch["input_ids"], batch["attention_mask"], **kwargs)
        return token_logprobs(model, batch["input_ids"], batch["attention_mask"], **kwargs)

    def _values(self, batch):
        """The critic's values [B, T] of a micro-batch (padding-free under `optim.padding_free`)."""
        return self.critic(
            batch["input_ids"],
            batch["attention_mask"],
            packed=self.cfg.optim.padding_free,
            host_masks=HostMasks(batch["host_attention_mask"]) if "host_attention_mask" in batch else None,
        )

    @property
    def old_logprobs_in_update(self) -> bool:
        """The update computes the old log-probs itself (`optim.old_logprobs_from_update`, and the iteration takes
        one optimizer step, so every micro-batch is scored at the weights the rollouts were sampled with)."""
        o = self.cfg.optim
        return o.old_logprobs_from_update and self.cfg.algo.ppo_epochs == 1 and o.num_minibatches == 1

    @torch.no_grad()
    def prepare_batch(
        self, batch: dict[str, torch.Tensor] | None, keep_ratio: float, old_logprobs: bool | None = None
    ) -> dict[str, float]:
        """Adds `old_logprobs`, `ref_logprobs`, `values`, `returns`, `advantages` to `batch` (in place,
        moved to this module's device) and returns iteration metrics. `batch=None`: this rank kept
        nothing; it still joins the other ranks' collectives (under FSDP their sharded forwards, and the
        whitening sums), and returns no metrics. `old_logprobs`: score the policy here (default: unless
        `old_logprobs_in_update`, which leaves `old_logprobs`, the entropy and the log-prob gap to the update)."""
        if batch is not None:
            for k in list(batch):
                batch[k] = batch[k].to(self.device)
        score_policy = not self.old_logprobs_in_update if old_logprobs is None else old_logprobs
        parts = defaultdict(list)
        was_training = self.policy.training
        self.policy.eval()
        needs_pass = score_policy or self.cfg.algo.kl_coef > 0 or self.critic is not None
        for micro, real in self._micro_batches(batch) if needs_pass else ():
            scored = {}
            if score_policy:
                lp = self._logprobs(self.policy, micro, with_entropy=True)
                scored = {"old_logprobs": lp.logprobs, "entropy": lp.entropy}
            if self.cfg.algo.kl_coef > 0:
                scored["ref_logprobs"] = self._reference_logprobs(micro)
            if self.critic is not None:
                scored["values"] = self._values(micro)
            for k, v in scored.items():
                if real:  # a lock-step dummy's outputs are dropped
                    parts[k].append(v)
        self.policy.train(was_training)
        if self.sharded and needs_pass:
            self._fsdp.reshard()
        if batch is None:
            # whitening sums over all ranks' rows: this rank adds its (empty) share, or the others would wait
            self._estimate_advantages(_no_rows(self.device))
            return {}
        mask = batch["loss_mask"]
        for k, v in parts.items():
            batch[k] = merge_micro_batches(v, batch)
        advantages, returns = self._estimate_advantages(batch)
        if returns is not None:
            batch["returns"] = returns
        batch["advantages"] = scale_by_keep_rate(advantages, keep_ratio, self.cfg.filter.advantage_scaling)
        metrics = {"actor/advantage_mean": _masked_mean(batch["advantages"], mask)}
        if score_policy:
            metrics["actor/entropy"] = _masked_mean(batch.pop("entropy"), mask)
            metrics["rollout/logprob_gap"] = self._logprob_gap(batch["sample_logprobs"], batch["old_logprobs"], mask)
        if self.critic is not None:
            metrics["critic/value_mean"] = _masked_mean(batch["values"], mask)
        if self.cfg.algo.advantage == "gigpo":
            metrics["gigpo/anchored_step_fraction"] = anchored_step_fraction(
                batch["group_ids"], mask, batch["turn_end_mask"], batch["turn_state_ids"]
            )
        return metrics

    def _estimate_advantages(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`estimate_advantages` of this rank's rows; GAE whitening uses the sums over all ranks' rows, so
        that a multi-rank run whitens as the single process on all rows does (a collective when whitening)."""
        a = self.cfg.algo
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

    def _loss_settings(self) -> dict:
        """`actor_loss`'s settings from `algo.*`; Dr.GRPO's constant length is the whole response budget."""
        a, r = self.cfg.algo, self.cfg.rollout
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

    # -- diagnostics (`RolloutDataModule` calls them on every iteration's rollouts) ---------------------
    def collapse_diagnostics(self, trajectories, iteration: int) -> dict[str, float]:
        return self.collapse.maybe_compute(
            self.inference_policy(),
            self.chat,
            trajectories,
            iteration,
            self.cfg.rollout.temperature,
            compile_head=self.compiled,
        )

    def gradient_buckets(self, trajectories, iteration: int) -> dict[str, float]:
        """`diagnostics.gradient_buckets`, on the diagnostics schedule: Fig. 3's task vs regulariser gradient
        norms per reward-variance bucket over *all* groups (before filtering), and each bucket's mean RV;
        {} otherwise."""
        if not (self.cfg.diagnostics.gradient_buckets and self.collapse.due(iteration)):
            return {}
        K = self.cfg.rollout.group_size
        rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float64).view(-1, K)
        batch = collate(trajectories, self.pad_token_id, turn_level_rewards=self.cfg.algo.turn_level_rewards)
        self.prepare_batch(batch, keep_ratio=1.0, old_logprobs=True)  # the norms' PPO loss reads them
        norms = self.gradient_bucket_norms(batch, row_buckets(rewards, self.cfg.filter.score), NUM_BUCKETS)
        return {**norms, **bucket_reward_variance(rewards, self.cfg.filter.score)}

    def gradient_bucket_norms(
        self, batch: dict[str, torch.Tensor], row_bucket: torch.Tensor, num_buckets: int
    ) -> dict[str, float]:
        """`metrics.gradient_buckets.gradient_bucket_norms` of the policy on a prepared `batch`."""
        device = batch["input_ids"].device
        return gradient_bucket_norms(
            self.policy,
            batch["loss_mask"],
            row_bucket,
            num_buckets,
            micro_batches=lambda rows: self._micro_batches(select_rows(batch, rows.to(device))),
            score=lambda micro, with_entropy: self._logprobs(self.policy, micro, with_entropy=with_entropy),
            loss_settings=self._loss_settings(),
            sharded=self.sharded,
        )

    # -- the update -------------------------------------------------------------------------------
    def training_step(self, minibatch, batch_idx):
        has_rows = "empty" not in minibatch
        if int(dist_utils.sum_over_ranks(torch.tensor([int(has_rows)])).item()) == 0:
            return None  # no rank kept anything: this iteration makes no update
        # a rank without rows still takes the same optimizer step as the others (see `update`)
        self.update(minibatch if has_rows else None, *self._optimizers_and_schedulers())
        return None

    def _optimizers_and_schedulers(self):
        optimizers = self.optimizers()
        schedulers = self.lr_schedulers()
        return (
            optimizers if isinstance(optimizers, list) else [optimizers],
            schedulers if isinstance(schedulers, list) else [schedulers],
        )

    def update(self, minibatch, optimizers, schedulers) -> None:
        """One optimizer step of the actor (and critic) on one prepared mini-batch. None: this rank has no
        rows but others do; it joins their collectives (the totals, and under FSDP every sharded forward
        and backward, on dummies) and contributes zero gradients, so the replicas stay identical."""
        if minibatch is None:
            mask = torch.zeros(0, 1, dtype=torch.bool, device=self.device)
        else:
            mask = minibatch["loss_mask"]
        # normalise by the mini-batch totals over all ranks: gradients are then *summed* over ranks
        num_tokens, num_seqs = dist_utils.sum_over_ranks(torch.stack([mask.sum(), mask.any(-1).sum()]))
        totals = {"num_tokens": num_tokens.clamp(min=1), "num_seqs": num_seqs.clamp(min=1)}
        if dist_utils.is_distributed():
            # the busiest rank's trained tokens over the mean: every rank waits for it at the gradient sum
            busiest = dist_utils.tensor_max_over_ranks(mask.sum())
            self._record("parallel/token_imbalance", busiest * dist_utils.rank_and_world()[1] / totals["num_tokens"])
        settings = self._loss_settings()
        pg_total = 0.0
        from_update = self.old_logprobs_in_update
        entropy_bonus = self.cfg.algo.entropy_coef > 0
        scored = defaultdict(list)  # with `from_update`: per micro-batch, what prepare would have scored
        micros = self._micro_batches(minibatch)  # the actor's and the critic's
        for micro, real in micros:
            lp = self._logprobs(self.policy, micro, with_entropy=entropy_bonus or from_update)
            if not real:
                self.manual_backward(zero_loss(lp))
                continue
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
                self._record(f"actor/{k}", v)
            self.manual_backward(loss)
        if minibatch is not None:
            self._record("actor/pg_loss", pg_total)
        if scored:  # what prepare logs otherwise, computed as it does over the same rows
            old_logprobs, entropy = (merge_micro_batches(scored[k], minibatch) for k in ("old_logprobs", "entropy"))
            self._record("actor/entropy", _masked_mean(entropy, mask))
            self._record("rollout/logprob_gap", self._logprob_gap(minibatch["sample_logprobs"], old_logprobs, mask))
        self._step(optimizers[0], self.policy, "actor")
        schedulers[0].step()
        if self.critic is not None:
            self._update_critic(minibatch, micros, optimizers[1], totals["num_tokens"])
            schedulers[1].step()

    def _update_critic(self, minibatch, micros, optimizer, num_tokens: torch.Tensor) -> None:
        value_total = 0.0
        for micro, real in micros:
            values = self._values(micro)
            if not real:
                self.manual_backward(zero_loss(values))
                continue
            loss, stats = value_loss(
                values,
                micro["values"],
                micro["returns"],
                micro["loss_mask"],
                clip=self.cfg.algo.value_clip or None,
                loss_agg="token-mean",
                num_tokens=num_tokens,
            )
            value_total = value_total + loss.detach()
            for k, v in stats.items():
                self._record(f"critic/{k}", v)
            self.manual_backward(loss)
        if minibatch is not None:
            self._record("critic/value_loss", value_total)
        self._step(optimizer, self.critic, "critic")

    def _step(self, optimizer, model, name: str):
        clip = self.cfg.optim.grad_clip
        if not self.sharded and dist_utils.is_distributed():
            # FSDP's reduce-scatter has summed them already; a rank without rows adds zeros. Timed from this rank's
            # last backward: the wait for the slowest rank, then the all-reduce.
            self._synchronize()
            start = time.perf_counter()
            dist_utils.sum_gradients(model)
            self._synchronize()
            self._record("time/gradient_sum_s", time.perf_counter() - start)
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

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _record(self, key: str, value) -> None:
        # tensors stay on the device until `pop_step_stats`: a float() here would make the host wait
        # for every micro-batch's forward before it may queue the backward
        self._step_stats[key].append(value.detach() if torch.is_tensor(value) else float(value))

    def pop_step_stats(self) -> dict[str, float]:
        stats = {k: sum(float(x) for x in v) / len(v) for k, v in self._step_stats.items() if v}
        self._step_stats.clear()
        return stats


def attach_fabric(module: AgentRLModule) -> AgentRLModule:
    """Let `module.update` run outside `Trainer.fit` (benchmarks, tests): its `manual_backward` then goes
    through a single-device Lightning `Fabric` at full precision, i.e. a plain `loss.backward()`. The
    strategy only routes the backward, so its device does not matter: the module stays where it is."""
    L.Fabric(accelerator="cpu", devices=1).setup_module(module, move_to_device=False)
    return module
