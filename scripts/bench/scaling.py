"""Scaling: the multi-turn step of `bench_step.py` on 1, 2, 4… devices under DDP and FSDP.

Each (strategy, device count) is one `python -m ragen_lit fit` in its own process (Lightning starts the other
ranks), on `bench_step.py`'s random-init Qwen2 and workload (FrozenLake, PPO, no filter, 5 turns of 100 tokens),
with no validation and no diagnostics. The batch grows with the devices (weak scaling: `rollout.groups` = the
per-device groups x devices), so every rank rolls out and trains the same number of episodes whatever the count.
Timings come from the run's own MLflow store (`time/*`, logged per iteration; iteration 1 is the warm-up and is
left out), tokens from `rollout/sequence_tokens` (mean tokens per episode) x episodes.

Per row: step seconds, generation and update seconds, training tokens/s in all and per device (tokens of the
iteration's episodes / step seconds / devices), and the efficiency: per-device tokens/s over the same strategy's
one-device run; and, on GPUs, the largest memory any rank allocated while generating and while updating
(`memory/*_peak_gib`, `training.gpu_memory`). The target: >= 85% at 2 and 4 devices.

Strategy settings: `ddp` trains bfloat16 weights (as `bench_step.py`); `fsdp` float32 weights gathered and
computed in bfloat16, gradients reduced in float32 (`trainer.fsdp_param_dtype=bfloat16
trainer.fsdp_reduce_dtype=float32`, the README's FSDP recipe). `--set` changes every run.
Entry point: `scripts/bench_scaling.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.common import CONFIG, SMOKE_OVERRIDES, device_name, progress
from bench.machine import cpu_name, utc_now
from bench.random_model import DEFAULT_SHAPE, QWEN_SHAPES, write_random_model
from ragen_lit.analysis.runs import find_stores, load_runs
from ragen_lit.config import load_config
from ragen_lit.errors import ConfigError

STRATEGY_OVERRIDES = {
    "ddp": ["model.dtype=bfloat16"],
    "fsdp": ["model.dtype=float32", "trainer.fsdp_param_dtype=bfloat16", "trainer.fsdp_reduce_dtype=float32"],
}
SMOKE_STRATEGY_OVERRIDES = {"ddp": [], "fsdp": []}  # CPU: float32 throughout


@dataclass
class ScalingRow:
    strategy: str
    devices: int
    episodes: int
    step_s: float
    generation_s: float
    update_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    efficiency: float | None = None
    """per-device tokens/s over the same strategy's one-device row (None without one)"""
    generation_peak_gib: float | None = None
    """largest GPU memory any rank allocated while generating, over the run's iterations (None off CUDA)"""
    update_peak_gib: float | None = None
    """the same for the update"""
    token_imbalance: float | None = None
    """the busiest rank's trained tokens over the mean, per optimizer step (`parallel/token_imbalance`; None on one
    device)"""
    gradient_sum_s: float | None = None
    """seconds from rank 0's last backward to its summed gradients, per optimizer step: the wait for the slowest rank
    and the all-reduce (`time/gradient_sum_s`; DDP only)"""


def steady_mean(history: list[tuple[int, float]]) -> float:
    """Mean of a per-iteration metric over iterations 2.. (iteration 1 pays warm-up and compilation)."""
    values = [value for step, value in history if step >= 2]
    if not values:
        raise ValueError("no iteration after the first was logged: run at least 2 iterations")
    return statistics.fmean(values)


def optional_steady_mean(history: list[tuple[int, float]] | None) -> float | None:
    """`steady_mean` of a metric some runs do not log (None where not logged: a multi-rank metric on one device)."""
    return steady_mean(history) if history else None


def run_peak(history: list[tuple[int, float]] | None) -> float | None:
    """Largest value of a per-iteration peak-memory metric over all iterations (None: not logged, off CUDA)."""
    return max(value for _, value in history) if history else None


def scaling_row(strategy: str, devices: int, episodes: int, metrics: dict[str, list[tuple[int, float]]]) -> ScalingRow:
    """One table row from a run's metric histories (`time/iteration_s`, `time/generation_s`, `time/update_s`,
    `rollout/sequence_tokens`, and `memory/{generation,update}_peak_gib` where logged)."""
    step = steady_mean(metrics["time/iteration_s"])
    tokens = steady_mean(metrics["rollout/sequence_tokens"]) * episodes
    return ScalingRow(
        strategy=strategy,
        devices=devices,
        episodes=episodes,
        step_s=step,
        generation_s=steady_mean(metrics["time/generation_s"]),
        update_s=steady_mean(metrics["time/update_s"]),
        tokens_per_s=tokens / step,
        tokens_per_s_per_device=tokens / step / devices,
        generation_peak_gib=run_peak(metrics.get("memory/generation_peak_gib")),
        update_peak_gib=run_peak(metrics.get("memory/update_peak_gib")),
        token_imbalance=optional_steady_mean(metrics.get("parallel/token_imbalance")),
        gradient_sum_s=optional_steady_mean(metrics.get("time/gradient_sum_s")),
    )


def add_efficiency(rows: list[ScalingRow]) -> None:
    """Fill each row's efficiency against its strategy's one-device row, where there is one."""
    single = {row.strategy: row.tokens_per_s_per_device for row in rows if row.devices == 1}
    for row in rows:
        if row.strategy in single:
            row.efficiency = row.tokens_per_s_per_device / single[row.strategy]


def format_table(rows: list[ScalingRow]) -> str:
    lines = [
        "| strategy | devices | episodes | step s | generation s | update s | training tok/s | per device "
        "| efficiency | peak GiB, generation | peak GiB, update | token imbalance | gradient sum s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        efficiency = "–" if r.efficiency is None else f"{r.efficiency:.1%}"
        peaks = ["–" if gib is None else f"{gib:.1f}" for gib in (r.generation_peak_gib, r.update_peak_gib)]
        imbalance = "–" if r.token_imbalance is None else f"{r.token_imbalance:.3f}"
        gradient_sum = "–" if r.gradient_sum_s is None else f"{r.gradient_sum_s:.3f}"
        lines.append(
            f"| {r.strategy} | {r.devices} | {r.episodes} | {r.step_s:.2f} | {r.generation_s:.2f} | {r.update_s:.2f} "
            f"| {r.tokens_per_s:,.0f} | {r.tokens_per_s_per_device:,.0f} | {efficiency} | {peaks[0]} | {peaks[1]} "
            f"| {imbalance} | {gradient_sum} |"
        )
    return "\n".join(lines)


def run_fit(overrides: list[str], log: Path, timeout: float) -> int:
    """`python -m ragen_lit fit` with the bench's config and `overrides`, output to `log`; its exit status."""
    command = [sys.executable, "-m", "ragen_lit", "fit", "--config", str(CONFIG), *overrides]
    with open(log, "w") as out:
        try:
            return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 124


def run_overrides(args, strategy: str, devices: int, cuda: bool, model_folder: Path, run_folder: Path) -> list[str]:
    """The `fit` overrides of one run: the bench's workload, `devices` ranks of `strategy`, then `--set`."""
    return [
        "model.name=hf",
        f"model.path={model_folder}",
        "algo=ppo",
        "filter.strategy=none",
        "diagnostics.every_n_iterations=0",
        "validation.num_envs=0",
        f"trainer.iterations={args.iterations}",
        f"trainer.accelerator={'gpu' if cuda else 'cpu'}",
        f"trainer.devices={devices}",
        f"trainer.strategy={strategy}",
        "trainer.checkpoint_every=1000",
        f"logging.output_dir={run_folder}",
        *(SMOKE_OVERRIDES if args.smoke else []),
        *(SMOKE_STRATEGY_OVERRIDES if args.smoke else STRATEGY_OVERRIDES)[strategy],
        f"rollout.groups={args.groups_per_device * devices}",
        *args.set,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4], help="device counts to run")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGY_OVERRIDES), default=["ddp", "fsdp"])
    parser.add_argument(
        "--groups-per-device", type=int, help="prompts per device and iteration (default 16; --smoke: 2)"
    )
    parser.add_argument("--iterations", type=int, default=3, help="RL iterations per run (>= 2; the first is warm-up)")
    parser.add_argument("--model", choices=list(QWEN_SHAPES), default=DEFAULT_SHAPE)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every run")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--smoke", action="store_true", help="tiny model and batch on CPU ranks (gloo)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.iterations < 2:
        parser.error(f"--iterations {args.iterations}: at least 2 (the first is warm-up)")
    if min(args.devices) < 1:
        parser.error(f"--devices {args.devices}: each count must be >= 1")
    if args.groups_per_device is None:
        args.groups_per_device = 2 if args.smoke else 16
    if args.groups_per_device < 1:
        parser.error(f"--groups-per-device {args.groups_per_device}: at least 1")
    cuda = torch.cuda.is_available() and not args.smoke
    if not args.smoke and not cuda:
        parser.error("needs CUDA GPUs (or --smoke for CPU ranks)")
    available = torch.cuda.device_count() if cuda else os.cpu_count() or 1
    if max(args.devices) > available:
        parser.error(f"--devices {max(args.devices)}: this machine has {available}")

    device = torch.device("cuda" if cuda else "cpu")
    rows: list[ScalingRow] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as folder:
        model_folder = Path(folder) / "model"
        plan = []
        for strategy in args.strategies:
            for devices in args.devices:
                run_folder = Path(folder) / f"{strategy}-{devices}"
                overrides = run_overrides(args, strategy, devices, cuda, model_folder, run_folder)
                try:  # every run's config is checked before the model is written and any run starts
                    cfg = load_config(str(CONFIG), overrides)
                except ConfigError as error:
                    print(f"error: {error}", file=sys.stderr)
                    return 2
                plan.append((strategy, devices, run_folder, overrides, cfg.rollout.groups * cfg.rollout.group_size))
        write_random_model(model_folder, "smoke" if args.smoke else args.model, device)
        for strategy, devices, run_folder, overrides, episodes in plan:
            progress(f"{strategy} on {devices} device(s), {episodes} episodes per iteration")
            run_folder.mkdir(parents=True)
            status = run_fit(overrides, run_folder / "fit.log", args.timeout)
            runs = load_runs(find_stores([run_folder]))
            if status != 0 or not runs:
                failed.append(f"{strategy} x {devices} (exit {status})")
                print((run_folder / "fit.log").read_text()[-3000:], file=sys.stderr)
                continue
            rows.append(scaling_row(strategy, devices, episodes, runs[0].metrics))
    add_efficiency(rows)
    print(f"scaling benchmark: {device_name(device)} x {max(args.devices)}, {cpu_name()}, {utc_now()}")
    print(f"versions: torch {torch.__version__}; model {'smoke' if args.smoke else args.model} (random init)")
    print(format_table(rows))
    for line in failed:
        print(f"failed: {line}")
    if args.out:
        args.out.write_text(
            json.dumps({"date": utc_now(), "rows": [asdict(r) for r in rows], "failed": failed}, indent=1)
        )
    return 1 if failed else 0
