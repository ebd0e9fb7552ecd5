"""`RolloutDataModule`: every epoch (= one RL iteration) generates fresh rollouts and turns them into
the mini-batches `AgentRLModule.training_step` consumes.

Per iteration (ARCHITECTURE.md): sync engine → reset envs with fresh seeds → multi-turn rollout (with DAPO's
dynamic sampling, further rounds until the batch is full, `RolloutDataModule.sample`) → collapse diagnostics
(every n iterations, before filtering) → reward-variance filter (one global keep mask) → overlong reward
shaping of the kept rollouts (DAPO, `shape_overlong`) → old/ref log-probs, values and advantages on them →
mini-batches.
The data module reaches the LightningModule only through `RolloutModule` (below).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Protocol

import lightning as L
import torch
from torch.utils.data import DataLoader

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.rollout import EpisodeLimits, rollout
from ragen_lit.agent.trajectory import rollout_metrics
from ragen_lit.algos import overlong_penalty
from ragen_lit.engines import build_engine
from ragen_lit.engines.base import SamplingParams
from ragen_lit.envs import make_env
from ragen_lit.filtering import dynamic_sampling_keep, filter_stats, select_groups, select_trajectories
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.seeds import MINIBATCH_ORDER, ROLLOUT_SAMPLING, derive_seed
from ragen_lit.training.batch import collate, select_rows
from ragen_lit.training.gpu_memory import phase_peak, start_phase
from ragen_lit.training.sections import DataSections

log = logging.getLogger(__name__)
# Dynamic sampling's extra rounds draw their env seeds this far above the first round's (`train_seeds`)
ROUND_SEED_STRIDE = 10**8


def plan_minibatches(
    num_kept: int, num_total: int, num_minibatches: int, mode: str, epochs: int, generator: torch.Generator
) -> list[list[int]]:
    """Row indices of each mini-batch (docs/METHOD.md §4, keep-rate handling).

    `scale`: always `num_minibatches` optimizer steps per epoch; each mini-batch holds ~num_kept/num_minibatches
    rows, so a filtered iteration trains on fewer tokens. `fixed`: the unfiltered mini-batch size
    num_total/num_minibatches is kept and the step count falls with the keep rate (reference code)."""
    if num_kept == 0:
        return []
    if mode == "scale":
        size = math.ceil(num_kept / num_minibatches)
    elif mode == "fixed":
        size = math.ceil(num_total / num_minibatches)
    else:
        raise ValueError(f"filter.minibatch={mode!r}; allowed: scale, fixed")
    plan = []
    for _ in range(epochs):
        order = torch.randperm(num_kept, generator=generator).tolist()
        plan.extend(order[i : i + size] for i in range(0, num_kept, size))
    return plan


@contextmanager
def measured(timings: dict[str, float], phase: str, device: torch.device):
    """Time the block into `timings["time/<phase>_s"]` and, on a GPU, its allocation peak into
    `timings["memory/<phase>_peak_gib"]` (`training.gpu_memory`)."""
    started = time.perf_counter()
    start_phase(device)
    yield
    timings[f"time/{phase}_s"] = time.perf_counter() - started
    timings.update(phase_peak(device, phase))


class RolloutModule(Protocol):
    """What `RolloutDataModule` uses of `trainer.lightning_module` (`AgentRLModule` provides it), and nothing
    else: the data module reads no other member and changes none."""

    chat: ChatFormat  # prompt formatting and the tokenizer (rollouts, saved rollouts)
    pad_token_id: int  # pads collated batches and the transformers engine's prompts
    model_path: str  # the weights a vLLM engine loads
    device: torch.device  # where each phase's peak GPU memory is counted (`training.gpu_memory`)

    def inference_policy(self) -> torch.nn.Module:
        """The model rollouts run on (the engine is built on it and synced from it)."""

    def collapse_diagnostics(self, trajectories, iteration: int) -> dict[str, float]:
        """Collapse metrics of this iteration's rollouts, before filtering ({} when not due)."""

    def gradient_buckets(self, trajectories, iteration: int) -> dict[str, float]:
        """Paper Fig. 3 gradient norms of this iteration's rollouts, before filtering ({} when off or not due)."""

    def prepare_batch(self, batch: dict[str, torch.Tensor] | None, keep_ratio: float) -> dict[str, float]:
        """Adds old/ref log-probs, values, returns and advantages to the kept rows' `batch` (in place);
        None: this rank kept nothing but joins the other ranks' collectives (forwards, whitening sums)."""


class RolloutDataModule(L.LightningDataModule):
    """Rollouts → mini-batches, one iteration per epoch. Talks to the LightningModule through
    `RolloutModule` only: `self.trainer.lightning_module` in `train_dataloader`, the `module` argument of
    `run_rollouts` (also used by the validation callback, and by benchmarks without a Trainer).

    `rollouts_dir`: the folder every iteration's rollouts are written to as JSONL for `diagnose`
    (`logging.save_rollouts`); None writes none."""

    def __init__(self, cfg: DataSections, rollouts_dir: Path | None = None):
        super().__init__()
        self.cfg = cfg
        self.rollouts_dir = rollouts_dir
        self.engine = None
        self.iteration_metrics: dict[str, float] = {}
        self.rolled_out = -1  # the last iteration whose rollouts were generated (checkpointed)

    # -- environments -------------------------------------------------------------------------
    def env_factory(self):
        return partial(make_env, self.cfg.env.name, **self.cfg.env.options)

    def train_seeds(self, iteration: int, sampling_round: int = 0) -> tuple[list[int], list[int]]:
        """This rank's (seeds, group ids): group g of iteration i has seed `rollout.seed + groups*i + g`
        (fresh, disjoint prompts every iteration); groups are dealt round-robin to ranks.

        Dynamic sampling's extra round r ≥ 1 draws group g from `ROUND_SEED_STRIDE·r` above that seed, with
        group id `groups·r + g`: fresh prompts, disjoint from every first round's while groups × iterations
        stays below the stride, and group ids that stay unique within the iteration."""
        r = self.cfg.rollout
        rank, world = dist_utils.rank_and_world()
        seeds, groups = [], []
        for g in range(rank, r.groups, world):
            seeds += [r.seed + r.groups * iteration + g + ROUND_SEED_STRIDE * sampling_round] * r.group_size
            groups += [r.groups * sampling_round + g] * r.group_size
        return seeds, groups

    # -- one iteration ------------------------------------------------------------------------
    def run_rollouts(self, module: RolloutModule, seeds, groups, temperature: float, seed: int):
        policy = module.inference_policy()  # under FSDP a full replica, never the sharded policy
        if self.engine is None:
            self.engine = build_engine(
                self.cfg.rollout,
                self.cfg.model,
                policy=policy,
                model_path=module.model_path,
                pad_token_id=module.pad_token_id,
                seed=self.cfg.trainer.seed,
            )
        self.engine.sync(policy)
        r = self.cfg.rollout
        sampling = SamplingParams(
            temperature=temperature, top_p=r.top_p if temperature > 0 else 1.0, top_k=r.top_k, seed=seed
        )
        try:
            return rollout(
                self.engine,
                self.env_factory(),
                seeds,
                groups,
                module.chat,
                EpisodeLimits.of(self.cfg.rollout),
                sampling,
            )
        finally:
            self.engine.release()  # vLLM's sleep mode frees its memory for the update; the next call syncs first

    def train_dataloader(self):
        module: RolloutModule = self.trainer.lightning_module
        cfg = self.cfg
        iteration = self.trainer.current_epoch
        if iteration <= self.rolled_out:
            # Resumed from the checkpoint that ended this iteration, Lightning asks for its loader once more
            # before moving on. Its rollouts, diagnostics and update are done: running them again would fold
            # a second diagnostics value into the restored MI EMA. No rank steps on this placeholder.
            return DataLoader([{"empty": torch.tensor(True)}], batch_size=None, shuffle=False, collate_fn=lambda x: x)
        self.rolled_out = iteration
        timings = {}
        with measured(timings, "generation", module.device):
            trajectories, sampled, sampling_metrics = self.sample(module, iteration)
        # every generated rollout (all rounds: each draws fresh prompts) describes the policy, before selection
        metrics = {**rollout_metrics(trajectories), **sampling_metrics}

        with measured(timings, "diagnostics", module.device):
            metrics.update(module.collapse_diagnostics(trajectories, iteration))
        if self.rollouts_dir is not None:
            save_rollouts(self.rollouts_dir / f"iter_{iteration:05d}.jsonl", trajectories, module.chat.tokenizer)

        metrics.update(module.gradient_buckets(trajectories, iteration))
        keep_rows, filter_metrics = self.select(sampled)
        metrics.update(filter_metrics)
        kept = [sampled[i] for i in keep_rows]
        if cfg.algo.overlong_cache_fraction > 0 and kept:
            kept, shaping_metrics = shape_overlong(kept, cfg.rollout.max_new_tokens, cfg.algo.overlong_cache_fraction)
            metrics.update(shaping_metrics)
        plan: list[list[int]] = []
        batch = None
        if kept:
            with measured(timings, "prepare", module.device):
                batch = collate(kept, module.pad_token_id, turn_level_rewards=cfg.algo.turn_level_rewards)
                metrics.update(module.prepare_batch(batch, keep_ratio=metrics["filter/kept_ratio"]))
            generator = torch.Generator().manual_seed(derive_seed(cfg.trainer.seed, MINIBATCH_ORDER, iteration))
            plan = plan_minibatches(
                len(kept),
                len(sampled),
                cfg.optim.num_minibatches,
                cfg.filter.minibatch,
                cfg.algo.ppo_epochs,
                generator,
            )
        else:  # this rank kept nothing but joins the other ranks' collectives (sharded forwards, whitening sums)
            module.prepare_batch(None, keep_ratio=metrics["filter/kept_ratio"])
        metrics.update(timings)
        self.iteration_metrics = metrics
        minibatches = [select_rows(batch, rows) for rows in plan] if batch is not None else []
        # every rank must take the same number of steps (collectives), and an iteration that keeps
        # nothing still runs one no-op step so that the epoch and its logging happen
        steps = max(dist_utils.max_over_ranks(len(minibatches)), 1)
        minibatches += [{"empty": torch.tensor(True)}] * (steps - len(minibatches))
        return DataLoader(minibatches, batch_size=None, shuffle=False, collate_fn=lambda x: x)

    def sample(self, module: RolloutModule, iteration: int):
        """This iteration's rollouts: (every generated trajectory, this rank's batch, `sampling/*` metrics).

        Without `algo.dynamic_sampling` one round of `rollout.groups` groups, all of it the batch, no metrics.
        With it (DAPO), rounds of `rollout.groups` fresh groups until the groups with non-zero reward variance
        over all ranks number `rollout.groups` or `algo.max_sampling_rounds` rounds ran; the batch is the first
        `rollout.groups` of them in (round, group) order (`filtering.dynamic_sampling_keep`: an over-filled
        batch is trimmed). Rule at the cap: the iteration trains on the groups it kept (fewer than
        `rollout.groups`, possibly none, then nothing is updated as with an empty filter) and warns once.
        Logged: `sampling/rounds`, `sampling/groups_generated`, `sampling/groups_kept`, `sampling/cap_hit`."""
        cfg = self.cfg
        rounds = cfg.algo.max_sampling_rounds if cfg.algo.dynamic_sampling else 1
        trajectories = []
        for sampling_round in range(rounds):
            seeds, groups = self.train_seeds(iteration, sampling_round)
            seed = derive_seed(cfg.trainer.seed, ROLLOUT_SAMPLING, iteration + ROUND_SEED_STRIDE * sampling_round)
            trajectories += self.run_rollouts(module, seeds, groups, cfg.rollout.temperature, seed=seed)
            if not cfg.algo.dynamic_sampling:
                return trajectories, trajectories, {}
            rewards, group_ids, local_groups = self._gather_rewards(trajectories)
            keep = dynamic_sampling_keep(rewards, cfg.rollout.groups)
            if int(keep.sum()) == cfg.rollout.groups:
                break
        kept_groups = set(group_ids[keep].tolist())
        num_kept = len(kept_groups)
        if num_kept < cfg.rollout.groups:
            log.warning(
                f"dynamic sampling: {num_kept} of rollout.groups={cfg.rollout.groups} groups with non-zero reward "
                f"variance after algo.max_sampling_rounds={rounds} rounds; iteration {iteration} trains on those"
            )
        sampled = [t for t in trajectories if t.group in kept_groups]
        metrics = {
            "sampling/rounds": float(sampling_round + 1),
            "sampling/groups_generated": float(rewards.shape[0]),
            "sampling/groups_kept": float(num_kept),
            "sampling/cap_hit": float(num_kept < cfg.rollout.groups),
        }
        return trajectories, sampled, metrics

    def _gather_rewards(self, trajectories) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(all ranks' rewards [G, K] and group ids [G], sorted by group id; this rank's group ids [G_local])."""
        K = self.cfg.rollout.group_size
        local = torch.tensor([t.reward for t in trajectories], dtype=torch.float64).view(-1, K)
        local_groups = torch.tensor([t.group for t in trajectories[::K]], dtype=torch.long)
        rewards, group_ids = dist_utils.gather_groups(local, local_groups)
        return rewards, group_ids, local_groups

    def select(self, trajectories) -> tuple[list[int], dict[str, float]]:
        """The reward-variance filter on all ranks' groups at once; returns this rank's kept rows."""
        f = self.cfg.filter
        K = self.cfg.rollout.group_size
        rewards, group_ids, local_groups = self._gather_rewards(trajectories)
        if f.level == "trajectory":
            # [G, K]: the statistics and the keep rate passed to the update count rollouts, not groups
            keep = keep_rows_all = select_trajectories(rewards, f.value)
        else:
            keep = select_groups(
                rewards,
                strategy=f.strategy,
                value=f.value,
                score=f.score,
                include_zero=f.include_zero,
                quartile=f.quartile,
            )
            keep_rows_all = keep[:, None].expand_as(rewards)
        dist_utils.assert_same_on_all_ranks(keep, "filter keep mask")
        stats = {f"filter/{k}": float(v) for k, v in filter_stats(rewards, keep).items()}
        position = {int(g): i for i, g in enumerate(group_ids.tolist())}
        keep_rows = []
        for j, g in enumerate(local_groups.tolist()):
            row_keep = keep_rows_all[position[g]]
            keep_rows += [j * K + k for k in range(K) if bool(row_keep[k])]
        return keep_rows, stats

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self):
        return {"iteration_metrics": self.iteration_metrics, "rolled_out": self.rolled_out}

    def load_state_dict(self, state):
        self.iteration_metrics = dict(state.get("iteration_metrics", {}))
        self.rolled_out = int(state.get("rolled_out", -1))


def shape_overlong(trajectories, max_new_tokens: int, cache_fraction: float) -> tuple[list, dict[str, float]]:
    """DAPO's overlong reward shaping in the multi-turn setting: every turn is one generation with its own
    budget L_max = `rollout.max_new_tokens`, so each turn's response length (its sampled tokens) gets
    `algos.overlong_penalty(length, L_max, L_cache)`, L_cache = round(`cache_fraction`·L_max), added to that
    turn's reward; the episode return (the sum of turn rewards) gets the sum of its turns' penalties. Where
    the rewards then sit is unchanged (`collate`: the return on the last sampled token, or each turn's reward
    on its end token with `algo.turn_level_rewards`). Returns shaped copies and `overlong/*` metrics (means
    over this rank's kept trajectories and their turns)."""
    cache = round(cache_fraction * max_new_tokens)
    lengths = torch.tensor([turn.response_end - turn.prompt_end for t in trajectories for turn in t.turns])
    penalties = overlong_penalty(lengths, max_new_tokens, cache).tolist()
    shaped, start = [], 0
    for traj in trajectories:
        own = penalties[start : start + len(traj.turns)]
        start += len(traj.turns)
        turns = [dataclasses.replace(turn, reward=turn.reward + p) for turn, p in zip(traj.turns, own)]
        shaped.append(dataclasses.replace(traj, turns=turns, reward=traj.reward + sum(own)))
    return shaped, {
        "overlong/penalty_mean": sum(penalties) / len(trajectories),
        "overlong/penalised_turn_rate": sum(p < 0 for p in penalties) / max(len(penalties), 1),
    }


def save_rollouts(path: Path, trajectories, tokenizer) -> None:
    """One JSON object per reasoning sample (`prompt`, `reasoning`, `group`, …), the format `diagnose` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for index, traj in enumerate(trajectories):
            for turn_index, turn in enumerate(traj.turns):
                if turn.reasoning is None:
                    continue
                record = {
                    "prompt": tokenizer.decode(traj.token_ids[: turn.prompt_end], skip_special_tokens=False),
                    "reasoning": turn.reasoning,
                    "group": traj.group if turn_index == 0 else f"{traj.group}/{index}/{turn_index}",
                    "turn": turn_index + 1,
                    "trajectory": index,
                    "seed": traj.seed,
                    "reward": traj.reward,
                }
                fh.write(json.dumps(record) + "\n")
