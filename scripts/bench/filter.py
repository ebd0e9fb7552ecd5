"""Update time with and without SNR-aware filtering on the *same* rollout batch (docs/METHOD.md §4).

One rollout batch of the default FrozenLake recipe is generated once; then, for each filter setting,
the kept rollouts are prepared (old log-probs, values, advantages) and the update (all mini-batch
optimizer steps of one iteration) is timed from the same initial weights. With `filter.minibatch=scale`
the number of optimizer steps is unchanged and each mini-batch shrinks with the keep rate, so the
update time should fall to about kept_ratio × the unfiltered time (target: within 1.25×).
Entry point: `scripts/bench_filter.py`.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time

import torch

from ragen_lit.config import load_config
from ragen_lit.training.batch import collate, select_rows
from ragen_lit.training.data import RolloutDataModule, plan_minibatches
from ragen_lit.training.module import AgentRLModule, attach_fabric
from ragen_lit.training.sections import DataSections, ModuleSections


def timed_update(module: AgentRLModule, trajectories, keep_rows, cfg, repeats: int) -> tuple[float, int, int]:
    """Median seconds of one iteration's update on the kept rows (weights restored between repeats),
    the number of optimizer steps, and the kept rows' real tokens."""
    kept = [trajectories[i] for i in keep_rows]
    batch = collate(kept, module.pad_token_id)
    tokens = int(batch["attention_mask"].sum())
    module.prepare_batch(batch, keep_ratio=len(kept) / len(trajectories))
    plan = plan_minibatches(
        len(kept),
        len(trajectories),
        cfg.optim.num_minibatches,
        cfg.filter.minibatch,
        cfg.algo.ppo_epochs,
        torch.Generator().manual_seed(0),
    )
    minibatches = [select_rows(batch, rows) for rows in plan]
    state = copy.deepcopy(module.state_dict())
    times = []
    for repeat in range(repeats + 1):  # the first pass warms up allocator and caches and is not timed
        module.load_state_dict(state)
        optimizers, schedulers = module.configure_optimizers()
        start = time.perf_counter()
        for mb in minibatches:
            module.update(mb, optimizers, schedulers)
        if repeat:
            times.append(time.perf_counter() - start)
        module.pop_step_stats()
    module.load_state_dict(state)
    return statistics.median(times), len(minibatches), tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="conf/frozenlake.yaml")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.trainer.seed)
    module = attach_fabric(AgentRLModule(ModuleSections.of(cfg)))  # `update` without a Trainer
    data = RolloutDataModule(DataSections.of(cfg))
    seeds, groups = data.train_seeds(0)
    t0 = time.perf_counter()
    trajectories = data.run_rollouts(module, seeds, groups, cfg.rollout.temperature, seed=0)
    generation_s = time.perf_counter() - t0
    rows = []
    for strategy, value in (("none", 1.0), ("top_p", cfg.filter.value)):
        data.cfg.filter.strategy, data.cfg.filter.value = strategy, value
        keep_rows, stats = data.select(trajectories)
        if not keep_rows:  # every group's rewards were equal: the filter keeps nothing and fit skips the update
            rows.append((strategy, value, 0.0, 0, 0, 0.0, 0))
            continue
        seconds, steps, tokens = timed_update(module, trajectories, keep_rows, cfg, args.repeats)
        rows.append((strategy, value, stats["filter/kept_ratio"], len(keep_rows), steps, seconds, tokens))
    base = rows[0][5]
    cpu = platform.processor() or platform.machine()
    print(
        f"bench_filter  {time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  {cpu}  "
        f"threads={torch.get_num_threads()}  device=cpu  model={module.model_path}"
    )
    print(
        f"config: {args.config} {' '.join(args.overrides)}  minibatch={cfg.filter.minibatch}  "
        f"num_minibatches={cfg.optim.num_minibatches}  rollouts={len(trajectories)}  generation={generation_s:.1f}s"
    )
    print(
        f"{'strategy':<10}{'value':>7}{'kept ratio':>12}{'kept rows':>11}{'token ratio':>13}{'opt steps':>11}"
        f"{'update s':>10}{'vs none':>9}{'ratio/kept':>12}"
    )
    for strategy, value, kept_ratio, kept_rows, steps, seconds, tokens in rows:
        rel = seconds / base
        print(
            f"{strategy:<10}{value:>7.2f}{kept_ratio:>12.3f}{kept_rows:>11d}{tokens / rows[0][6]:>13.3f}{steps:>11d}"
            f"{seconds:>10.2f}{rel:>9.3f}{(rel / kept_ratio if kept_ratio else float('nan')):>12.3f}"
        )
    kept_ratio = rows[1][2]
    if kept_ratio > 0:
        verdict = "meets" if rows[1][5] <= 1.25 * kept_ratio * base else "MISSES"
        print(
            f"target: filtered update <= 1.25 x kept_ratio x unfiltered = {1.25 * kept_ratio * base:.2f}s -> {verdict}"
        )
    else:
        print(
            "target: not measurable: top-p kept nothing (all groups' rewards were equal), so there is no update to time"
        )
    return 0
