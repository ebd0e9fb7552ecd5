"""What `sweep` checks before any run starts, beyond each run's config (`plan` loads and validates every one): how
many runs a sweep makes (`MAX_RUNS`), and `fit`'s own checks before training (`run.preflight`: installed packages,
devices, memory, local paths, the model's shape, the env's options) on every grid point's config as its runs get it.
A grid point this machine cannot run is refused in one line naming the point and the key, before any run trained. The
`--devices` given must be GPUs of this machine, and no run may ask for the other kind of device than the sweep gives
it; under `--launcher submitit_slurm` every run must be one process (`check_one_process`).

Runs that go to other machines (`--launcher submitit_slurm`, `--print-commands`) get the checks that need no machine
only (the env's options against the context): a cluster's node has its own memory, cores and devices, and the run's
`fit` checks them there.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ragen_lit.config import Config
from ragen_lit.errors import ConfigError

MAX_RUNS = 10_000
"""the most runs (grid points x seeds) one sweep makes: a larger grid is several sweeps (each its own folder, lock and
`compare` target), and planning it would take minutes of this process before the first run"""


def check_run_count(points: int, seeds: int, grid: str) -> None:
    """`points` grid points x `seeds` seeds make at most `MAX_RUNS` runs; `grid`: how the points came about."""
    if points * seeds > MAX_RUNS:
        raise ConfigError(
            f"{grid} = {points:,} grid point(s) x --seeds {seeds} = {points * seeds:,} runs; a sweep makes at most "
            f"{MAX_RUNS:,} runs: split the grid into several sweeps, or give fewer values or seeds"
        )


def check_threads(threads: int) -> None:
    """`--threads-per-run` of runs on this machine: no more than its cores (`fit` refuses more torch threads)."""
    cores = os.cpu_count() or 1
    if threads > cores:
        raise ConfigError(f"--threads-per-run {threads}: this machine has {cores} CPU cores; use at most {cores}")


def check_runs(specs: list, configure: Callable[[Config], Config] | None) -> None:
    """`fit`'s checks before training on each grid point's config (`specs`: the sweep's `RunSpec`s) as `configure`
    makes it for its runs (the sweep's threads and placement); with `configure` None (the runs go to other machines)
    the checks that need no machine. The seeds of a point differ in `trainer.seed` alone, which no check reads: one
    check per point."""
    from ragen_lit.run.preflight import check_env, preflight

    checked: set[str] = set()
    for spec in specs:
        if spec.point in checked:
            continue
        checked.add(spec.point)
        try:
            if configure is None:
                check_env(spec.config.env, spec.config.rollout)
            else:
                preflight(configure(spec.config))
        except ConfigError as error:
            raise ConfigError(f"grid point {spec.point!r}: {error}") from None


def check_placement(specs: list, devices: list[str] | None) -> None:
    """Runs go where the sweep puts them: on GPUs with `--devices` (one per run), else on CPU cores. A run whose
    config asks for the other (`specs`: the sweep's `RunSpec`s) is refused before any starts, naming the setting."""
    wanted = "cpu" if devices else "gpu"
    for spec in specs:
        if spec.config.trainer.accelerator == wanted:
            fix = (
                "drop --devices to run on CPU cores"
                if devices
                else "add --devices (e.g. --devices 0,1,2,3: one run per GPU at a time)"
            )
            raise ConfigError(
                f"grid point {spec.point!r}: trainer.accelerator={wanted} but the sweep runs "
                f"{'on GPUs (--devices)' if devices else 'on CPU cores (no --devices)'}; {fix}"
            )


def check_one_process(specs: list, launcher: str) -> None:
    """Under `submitit_slurm` a run's job is one SLURM task, and Lightning in a SLURM job starts as many processes as
    the job has tasks: a run over several devices or nodes (`specs`: the sweep's `RunSpec`s) is refused there, before
    any starts."""
    if launcher != "submitit_slurm":
        return
    for spec in specs:
        trainer = spec.config.trainer
        if trainer.num_nodes != 1 or str(trainer.devices) not in ("1", "auto"):
            raise ConfigError(
                f"grid point {spec.point!r}: trainer.devices={trainer.devices} trainer.num_nodes={trainer.num_nodes}, "
                "but --launcher submitit_slurm runs each run as one process (one SLURM task); run such a grid with "
                "--print-commands, one srun per run"
            )


def check_devices(devices: list[str] | None, visible: int) -> None:
    """`--devices` must name GPUs this machine has (`visible`: how many CUDA sees): integer ids below that count,
    or GPU/MIG UUIDs as CUDA_VISIBLE_DEVICES takes them. Refused before any run starts, naming the bad id."""
    if not devices:
        return
    listed = ",".join(devices)
    if visible == 0:
        raise ConfigError(
            f"--devices {listed}: this machine has no usable CUDA GPU; drop --devices to run on CPU cores"
        )
    for device in devices:
        if device.startswith(("GPU-", "MIG-")):
            continue
        if not device.isdigit() or int(device) >= visible:
            raise ConfigError(
                f"--devices {listed}: no GPU {device!r} here; this machine has {visible} "
                f"(ids 0..{visible - 1}, or GPU UUIDs)"
            )
