"""`AgentRLModule`: policy (+ critic, + frozen reference) and the PPO-family update, manual optimisation.

With `model.lora.r > 0` the policy and the critic's backbone carry peft adapters and only those (and the value
head) train; the KL reference is the policy with its adapters disabled, and checkpoints leave the frozen base
weights out.

The algorithm's math lives in `ragen_lit.algos` (pure tensor functions); this class wires it to Lightning:
`prepare_batch` computes old/ref log-probs, values and advantages for one iteration's kept rollouts, and
`update` (what `training_step` runs) is the PPO/GRPO update of one mini-batch, read top to bottom in one place:
one optimizer step of actor and critic over its micro-batches, whose losses add up exactly to the mini-batch
loss (every backward goes through `manual_backward`).
What `RolloutDataModule` uses of it is listed in `ragen_lit.training.data.RolloutModule`.

Under `trainer.strategy=fsdp`, `configure_model` shards policy, critic and reference with FSDP2
(`ragen_lit.parallel.fsdp`); every sharded forward/backward then runs in lock-step over the ranks
(`ragen_lit.parallel.lockstep`). Rollouts and the MI cross-scorer run an unknown, rank-dependent number
of forwards and use `inference_policy()`, a full per-rank replica of the policy refreshed from the
shards after updates.
"""

from __future__ import annotations

from collections import defaultdict

import lightning as L
import torch

from ragen_lit.algos import actor_loss, value_loss
from ragen_lit.logprobs import HostMasks, token_logprobs
from ragen_lit.metrics.collapse import CollapseDiagnostics
from ragen_lit.metrics.gradient_buckets import NUM_BUCKETS, bucket_reward_variance, gradient_bucket_norms, row_buckets
from ragen_lit.models import compile_layers, layer_units, resolve_compile
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.parallel.lockstep import lockstep, zero_loss
from ragen_lit.parallel.sharded import ShardedModels
from ragen_lit.presets import load_chat, resolve_model_path
from ragen_lit.training import prepare, steps
from ragen_lit.training.batch import collate, planned_micro_batches, select_rows
from ragen_lit.training.build_models import build_models, check_trainable_state, frozen_copy, frozen_keys
from ragen_lit.training.gpu_memory import cap_process_memory
from ragen_lit.training.optimizers import build_optimizers, warn_stalled_updates
from ragen_lit.training.sections import ModuleSections


class AgentRLModule(L.LightningModule):
    def __init__(self, cfg: ModuleSections):
        super().__init__()
        self.cfg = cfg
        self._logprob_gap = prepare.LogprobGap(cfg.rollout.engine)
        self.automatic_optimization = False
        self.model_path = resolve_model_path(cfg.model)
        self.tokenizer, self.chat = load_chat(cfg.model, self.model_path)  # model.chat_template applied
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.policy, self.critic = build_models(cfg.model, cfg.trainer, cfg.algo.advantage, self.model_path)
        if cfg.model.lora.r > 0:  # checkpoints leave the frozen base weights out; `on_load_checkpoint` checks the rest
            self.strict_loading = False
        # the frozen reference is re-creatable from the weights on disk: keep it out of checkpoints. Under LoRA the
        # reference is the policy with its adapters disabled (`_reference_logprobs`): no copy at all
        self._reference = [frozen_copy(self.policy)] if cfg.algo.kl_coef > 0 and cfg.model.lora.r == 0 else []
        self.collapse = CollapseDiagnostics(cfg.diagnostics)
        self._step_stats: dict[str, list[float]] = defaultdict(list)
        self._configured = False  # `configure_model` ran (sharding and compilation happen once)
        self._fsdp: ShardedModels | None = None  # set by `configure_model` under FSDP (a plain object: not a submodule)
        self._policy_version = 0  # optimizer steps of the policy: the inference replica follows it

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

    # -- checkpoints: under LoRA what training changes, without the frozen base weights (`model.path`'s) ------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        frozen = frozen_keys(self)
        if frozen:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k not in frozen}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        frozen = frozen_keys(self)
        if frozen:
            expected = set(self.state_dict()) - frozen
            check_trainable_state(set(checkpoint["state_dict"]), expected, self.cfg.model.lora.r)

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
        # model.compile=null (auto) leaves a model without repeated layer classes eager; true refuses it
        if self.compiled and (self.cfg.model.compile or layer_units(self.policy)):
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

    def _micro_batches(self, batch: dict[str, torch.Tensor] | None) -> list[tuple[dict[str, torch.Tensor], bool]]:
        """`(micro-batch, is_real)` pairs over `batch` (None or zero rows: this rank has nothing), padded
        with dummies to the busiest rank's count under FSDP (`parallel.lockstep`)."""
        real = () if batch is None else planned_micro_batches(batch, self.cfg.optim, self.device)
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
        """The update takes the old log-probs from its own scores (`steps.OldPolicyFromUpdate`, which says why that
        is exact): `optim.old_logprobs_from_update`, and the iteration takes one optimizer step."""
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
        needs_pass = score_policy or self.cfg.algo.kl_coef > 0 or self.critic is not None

        def score(micro):  # the passes in order: policy, reference, critic
            scored = {}
            if score_policy:
                lp = self._logprobs(self.policy, micro, with_entropy=True)
                scored = {"old_logprobs": lp.logprobs, "entropy": lp.entropy}
            if self.cfg.algo.kl_coef > 0:
                scored["ref_logprobs"] = self._reference_logprobs(micro)
            if self.critic is not None:
                scored["values"] = self._values(micro)
            return scored

        was_training = self.policy.training
        self.policy.eval()
        parts = prepare.score_micro_batches(self._micro_batches(batch) if needs_pass else (), score)
        self.policy.train(was_training)
        if self.sharded and needs_pass:
            self._fsdp.reshard()
        if batch is None:
            # whitening sums over all ranks' rows: this rank adds its (empty) share, or the others would wait
            prepare.advantages_of(self.cfg.algo, prepare.no_rows(self.device))
            return {}
        return prepare.finish_batch(self.cfg.algo, self.cfg.filter, batch, parts, keep_ratio, self._logprob_gap)

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
            loss_settings=steps.loss_settings(self.cfg.algo, self.cfg.rollout),
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
        return tuple(x if isinstance(x, list) else [x] for x in (self.optimizers(), self.lr_schedulers()))

    def update(self, minibatch, optimizers, schedulers) -> None:
        """One PPO/GRPO optimizer step of the actor, then of the critic, on one prepared mini-batch, top to bottom:
        the mini-batch totals that normalise the losses; for each micro-batch the policy's scores, the actor loss
        (`algos.actor_loss`), its backward and its stats; the actor's optimizer step; the critic likewise
        (`algos.value_loss`).

        The totals are summed over all ranks, so the micro-batch losses add up to the mini-batch loss and gradients
        are summed over ranks. `minibatch` None: this rank has no rows but others do; it joins their collectives
        (the totals, and under FSDP every sharded forward and backward, on lock-step dummies: `real` False, a zero
        loss, nothing recorded) and contributes zero gradients, so the replicas stay identical. The old log-probs
        come from prepare, or on the speed path from this update's own scores (`steps.OldPolicyFromUpdate`)."""
        if minibatch is None:
            mask = torch.zeros(0, 1, dtype=torch.bool, device=self.device)
        else:
            mask = minibatch["loss_mask"]
        totals, imbalance = steps.minibatch_totals(mask)
        if imbalance is not None:
            self._record("parallel/token_imbalance", imbalance)
        micros = self._micro_batches(minibatch)  # the actor's and the critic's
        settings, entropy_bonus = steps.loss_settings(self.cfg.algo, self.cfg.rollout), self.cfg.algo.entropy_coef > 0
        # the speed path: the old log-probs from this update's own scores, which then carry the entropy
        own = steps.OldPolicyFromUpdate() if self.old_logprobs_in_update else None

        pg_loss = 0.0
        for micro, real in micros:
            scored = self._logprobs(self.policy, micro, with_entropy=entropy_bonus or own is not None)
            if not real:
                self.manual_backward(zero_loss(scored))
                continue
            loss, stats = actor_loss(
                scored.logprobs,
                micro["loss_mask"],
                old_logprobs=micro["old_logprobs"] if own is None else own.old_logprobs(scored),
                advantages=micro["advantages"],
                entropy=scored.entropy if entropy_bonus else None,
                ref_logprobs=micro.get("ref_logprobs"),
                **settings,
                **totals,
            )
            pg_loss = pg_loss + stats.pop("pg_loss")  # the micro-batch losses add up to the mini-batch's
            self._record_all(stats, "actor/")
            self.manual_backward(loss)
        if minibatch is not None:
            self._record("actor/pg_loss", pg_loss)
            if own is not None:  # what prepare logs of its policy pass
                self._record_all(own.metrics(minibatch, self._logprob_gap))
        self._step(optimizers[0], self.policy, "actor")
        schedulers[0].step()
        if self.critic is None:
            return

        value_loss_sum = 0.0
        for micro, real in micros:
            predicted = self._values(micro)
            if not real:
                self.manual_backward(zero_loss(predicted))
                continue
            loss, stats = value_loss(
                predicted,
                micro["values"],
                micro["returns"],
                micro["loss_mask"],
                clip=self.cfg.algo.value_clip or None,
                loss_agg="token-mean",
                num_tokens=totals["num_tokens"],
            )
            value_loss_sum = value_loss_sum + loss.detach()
            self._record_all(stats, "critic/")
            self.manual_backward(loss)
        if minibatch is not None:
            self._record("critic/value_loss", value_loss_sum)
        self._step(optimizers[1], self.critic, "critic")
        schedulers[1].step()

    def _step(self, optimizer, model, name: str):
        self._record_all(
            steps.optimizer_step(optimizer, model, name, clip=self.cfg.optim.grad_clip, sharded=self.sharded)
        )
        if model is self.policy:
            self._policy_version += 1  # the inference replica is stale from now on

    def _record(self, key: str, value) -> None:
        # tensors stay on the device until `pop_step_stats`: a float() here would make the host wait
        # for every micro-batch's forward before it may queue the backward
        self._step_stats[key].append(value.detach() if torch.is_tensor(value) else float(value))

    def _record_all(self, stats: dict, prefix: str = "") -> None:
        for key, value in stats.items():
            self._record(prefix + key, value)

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
