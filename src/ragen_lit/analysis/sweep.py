"""`python -m ragen_lit sweep`: a grid of `fit` runs as separate processes, recorded as one experiment.

The grid is written in Hydra's sweep grammar and parsed by Hydra's own override parser:
`filter.strategy=none,top_p,top_k`, `filter.value=range(0.5,1.0,0.25)`, `env.options.p=choice(0.8,0.9)`;
a plain `key=value` applies to every run. The runs are the Cartesian product of the sweep keys, times
`trainer.seed` 0..N-1 with `--seeds N`.

Every run is one `python -m ragen_lit fit --config <run>/config.yaml` process with its own folder
`<sweep>/<point>-seed<k>/` and the MLflow tags `sweep`, `point` (the grid point as `key=value,...`, or `base`)
and `seed`. The runs that run while the sweep waits for them share one MLflow store, `<sweep>/mlruns.db`, written
through an MLflow server the sweep starts and stops (`sweep_store`, `sweep_server`): one experiment that MLflow's
own UI shows side by side; runs sent to other machines keep a store each in their folders.
`python -m ragen_lit compare <sweep>` reads them all. The resolved config of each run is
written before anything starts, so a bad grid value is refused up front, and a cluster can run the same
files with its own launcher (`--print-commands` lists one command per run, e.g. for a SLURM job array).

A sweep makes at most `sweep_checks.MAX_RUNS` runs (10,000), and before the first starts every grid point's config
passes `fit`'s own checks (`sweep_checks.check_runs`: memory, devices, paths, the env) as its runs get it.

The runs go to a launcher: `local` (the default) is this module's process pool (`run_all`), each run pinned to its cores
or GPU; `joblib`, `submitit_local` and `submitit_slurm` are Hydra's launcher plugins, which get the runs not yet done as
one multirun of `ragen_lit.analysis.sweep_app` (`run_launched`; `sweep_launchers` checks their settings). Both start a
run's attempts the same way (`sweep_run`).

With several GPUs (`--devices`), every GPU runs every grid point about equally often and the points alternate in
time (`device_queues`), so that no condition is one card's and differences between cards (speed, numerics) do not
pose as differences between conditions.

A sweep folder is locked while a sweep works in it (`sweep_lock`): a second sweep on it is refused in one line.
Started again with the same arguments, a sweep finds its folder (the name is derived from them), skips
the runs that finished (`sweep_done` marker), resumes those with a complete checkpoint of any kind
(`trainer.resume=last`: a run stopped between its periodic checkpoint and its `last.ckpt` included) and starts the
rest afresh. A run that a `fit` of its own still trains (`run.lock`) is not touched: it is reported failed, naming
that process, and the same command again takes it up once that process ended. A sweep's runs end with it, however it
ends (`sweep_run`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ragen_lit.analysis.sweep_checks import (
    MAX_RUNS,
    check_devices,
    check_one_process,
    check_placement,
    check_run_count,
    check_runs,
    check_threads,
)
from ragen_lit.analysis.sweep_launchers import (
    LOCAL,
    ON_THIS_MACHINE,
    check_launcher,
    launcher_settings,
    multirun,
    split_settings,
)
from ragen_lit.analysis.sweep_lock import sweep_lock
from ragen_lit.analysis.sweep_run import (
    FAILED_MARKER,
    LOG_NAME,
    RunInUse,
    exit_reason,
    fit_command,
    outcome,
    record_end,
    record_failure,
    run_in_use,
    start_attempt,
    status,
)
from ragen_lit.analysis.sweep_server import LOG_NAME as SERVER_LOG
from ragen_lit.analysis.sweep_server import serving
from ragen_lit.analysis.sweep_store import check_store, prepare_store, run_store, store_path, store_uri
from ragen_lit.config import Config, TrainerConfig, load_config, render_yaml
from ragen_lit.config.overrides import parse_overrides
from ragen_lit.errors import ConfigError


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its grid point, seed, folder and its validated config."""

    point: str
    seed: int
    folder: Path
    config: Config


def expand_grid(overrides: list[str], seeds: int = 1) -> tuple[list[str], list[list[str]]]:
    """(fixed overrides, grid points): each grid point is the list of `key=value` strings of one
    combination of the sweep overrides, in the order given (Hydra's override grammar and parser). Refuses a grid
    that makes more than `MAX_RUNS` runs with `seeds` seeds before making its points."""
    try:
        parsed = parse_overrides(list(overrides), sweeps=True)
    except ConfigError as error:
        raise ConfigError(f"sweep grid: {error}") from None
    fixed, axes, sizes = [], [], []
    for override, text in zip(parsed, overrides, strict=True):
        if override.is_sweep_override():
            key = override.key_or_group
            values = list(itertools.islice(override.sweep_string_iterator(), MAX_RUNS + 1))  # a range may be huge
            if len(values) > MAX_RUNS:
                raise ConfigError(
                    f"{text}: more than {MAX_RUNS:,} values, and a sweep makes at most {MAX_RUNS:,} runs (grid points "
                    "x seeds); split the grid into several sweeps"
                )
            axes.append([f"{key}={value}" for value in values])
            sizes.append(f"{key} ({len(values)} values)")
        else:
            fixed.append(text)
    check_run_count(math.prod(len(axis) for axis in axes), seeds, f"sweep grid: {' x '.join(sizes) or 'one point'}")
    return fixed, [list(combination) for combination in itertools.product(*axes)]


def point_label(point: list[str]) -> str:
    """`key=value,...` of a grid point; `base` for the single point of a grid without sweep keys."""
    return ",".join(point) if point else "base"


def folder_name(point: list[str], seed: int) -> str:
    slug = "_".join(item.replace("=", "-") for item in point) or "base"
    return re.sub(r"[^A-Za-z0-9._-]", "", slug) + f"-seed{seed}"


def sweep_name(config: str | None, overrides: list[str], seeds: int) -> str:
    """The config's stem and a hash of the grid: the same command finds the same sweep folder again."""
    stem = Path(config).stem if config else "defaults"
    digest = hashlib.sha1("\n".join([*overrides, f"seeds={seeds}"]).encode()).hexdigest()[:8]
    return f"{stem}-{digest}"


def plan(config: str | None, overrides: list[str], seeds: int, root: Path, name: str) -> list[RunSpec]:
    """Every run of the grid, its config validated now: a bad key or value stops the sweep before
    any run starts, with the grid point it came from."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: give at least 1")
    if seeds > MAX_RUNS:
        raise ConfigError(
            f"--seeds {seeds}: a sweep makes at most {MAX_RUNS:,} runs (grid points x seeds); give at most --seeds "
            f"{MAX_RUNS}"
        )
    if any(o.split("=", 1)[0] == "trainer.seed" for o in overrides):
        raise ConfigError("trainer.seed: the sweep sets it (0..N-1 with --seeds N); drop it from the grid")
    fixed, points = expand_grid(overrides, seeds)
    runs = []
    for point in points:
        try:
            cfg = load_config(config, [*fixed, *point, "trainer.seed=0"])
        except ConfigError as error:
            raise ConfigError(f"grid point {point_label(point)!r}: {error}") from None
        for seed in range(seeds):  # the seeds differ in trainer.seed alone, and 0..N-1 are all valid seeds
            seeded = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, seed=seed))
            runs.append(RunSpec(point_label(point), seed, root / name / folder_name(point, seed), seeded))
    return runs


def write_run_config(spec: RunSpec, sweep: str, threads: int, store: str | None = None) -> Path:
    """`<run>/config.yaml`: the run's resolved config, with its output folder, tags, `threads` torch threads and its
    MLflow `store` (None: the config's own `logging.tracking_uri`)."""
    cfg = spec.config
    tags = {**cfg.logging.tags, "sweep": sweep, "point": spec.point, "seed": str(spec.seed)}
    uri = store or cfg.logging.tracking_uri
    cfg = dataclasses.replace(
        cfg,
        logging=dataclasses.replace(cfg.logging, output_dir=str(spec.folder), tags=tags, tracking_uri=uri),
        # torch threads match the cores the run is pinned to: more would only contend for them
        trainer=dataclasses.replace(cfg.trainer, threads=threads),
    )
    spec.folder.mkdir(parents=True, exist_ok=True)
    path = spec.folder / "config.yaml"
    path.write_text(render_yaml(cfg, f"# sweep {sweep}, point {spec.point}, seed {spec.seed}"))
    return path


GPU_SHARED_FRACTION = 0.95
"""of a card's memory, split equally among the runs that share it (the rest: each process's CUDA context)"""


@dataclass
class Slot:
    """Where one run executes: a set of CPU cores, and a GPU or none; `memory_share` is the fraction of that
    GPU's memory each run gets when several slots share it (None: the run has the card to itself)."""

    cores: tuple[int, ...]
    gpu: str | None = None
    memory_share: float | None = None


def slots(parallel: int | None, threads: int, devices: list[str] | None) -> list[Slot]:
    """One slot per concurrent run. With `devices`, one run per GPU, the cores split among them;
    otherwise `parallel` runs (default: as many as the cores allow), each pinned to `threads` cores."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if devices:
        share = max(len(cores) // len(devices), 1)
        runs_on = Counter(devices)  # runs sharing each GPU
        return [
            Slot(
                tuple(cores[i * share : (i + 1) * share]) or tuple(cores),
                gpu,
                round(GPU_SHARED_FRACTION / runs_on[gpu], 3) if runs_on[gpu] > 1 else None,
            )
            for i, gpu in enumerate(devices)
        ]
    count = parallel or max(len(cores) // threads, 1)
    return [Slot(tuple(cores[(i * threads + j) % len(cores)] for j in range(threads))) for i in range(count)]


def placement(trainer: TrainerConfig, slot: Slot) -> dict[str, object]:
    """The `trainer` settings of a run in `slot`, on top of its own (`trainer`): the CPU, or its GPU alone with the
    slot's share of the card's memory where several runs share it (a grid's own cap wins)."""
    if slot.gpu is None:
        return {"accelerator": "cpu"}
    placed: dict[str, object] = {"accelerator": "gpu", "devices": 1}
    if slot.memory_share is not None and not trainer.gpu_memory_fraction:
        placed["gpu_memory_fraction"] = slot.memory_share
    return placed


def placed(cfg: Config, threads: int, pool: list[Slot] | None = None) -> Config:
    """`cfg` as a run gets it, for `fit`'s checks before the sweep: its threads and, in the local `pool`, the
    placement of the slot with the smallest share of its GPU (any slot may run it); a launcher's job (`pool` None)
    runs where its config says."""
    trainer = dataclasses.replace(cfg.trainer, threads=threads)
    if pool:
        slot = min(pool, key=lambda slot: slot.memory_share or 1.0)
        trainer = dataclasses.replace(trainer, **placement(trainer, slot))
    return dataclasses.replace(cfg, trainer=trainer)


def launch(spec: RunSpec, slot: Slot, server: str | None = None) -> subprocess.Popen:
    """Start an attempt at `spec` in `slot`: on its cores, seeing its GPU only (a CPU slot sees none, else `auto`
    would stack every CPU run on GPU 0); `server`: the sweep's MLflow server."""
    env = {**os.environ, "OMP_NUM_THREADS": str(len(slot.cores)), "CUDA_VISIBLE_DEVICES": slot.gpu or ""}
    overrides = [f"trainer.{key}={value}" for key, value in placement(spec.config.trainer, slot).items()]
    return start_attempt(spec.folder, overrides, env, slot.cores, server)


def report(spec: RunSpec, say=print) -> bool:
    """Say how the run's last attempt ended, from its markers (`sweep_run.outcome`); whether it finished."""
    finished, detail = outcome(spec.folder)
    if finished:
        say(f"done    {spec.point} seed {spec.seed} ({detail})")
    elif detail is None:
        say(f"FAILED  {spec.point} seed {spec.seed} (no end recorded: its job did not run to its end)")
    else:
        say(f"FAILED  {spec.point} seed {spec.seed} ({detail}; see {spec.folder / LOG_NAME})")
    return finished


def interleaved(pool: list[Slot]) -> list[Slot]:
    """The slots with their devices taken in turn (a GPU's first slot, the next GPU's first, ..., then each one's
    second): consecutive positions are on different devices wherever there are several."""
    by_device: dict[str | None, list[Slot]] = {}
    for slot in pool:
        by_device.setdefault(slot.gpu, []).append(slot)
    rounds = itertools.zip_longest(*by_device.values())
    return [slot for turn in rounds for slot in turn if slot is not None]


def device_queues(specs: list[RunSpec], pool: list[Slot]) -> dict[str | None, list[RunSpec]]:
    """Which device runs which specs, in what order. Run (grid point p, seed s) goes to the device of position
    (s + p) mod (slots) of the `interleaved` slots: every device runs every grid point about as often as it has
    slots, so no condition is confounded with the card it ran on (a card's speed shows in step times, its numerics
    in results), and the placement of a run never depends on which runs are already done. Each queue runs in seed
    order, grid points alternating, so the conditions also share each stretch of time."""
    order = interleaved(pool)
    points = list(dict.fromkeys(spec.point for spec in specs))
    queues: dict[str | None, list[RunSpec]] = {slot.gpu: [] for slot in order}
    for spec in sorted(specs, key=lambda spec: (spec.seed, points.index(spec.point))):
        queues[order[(spec.seed + points.index(spec.point)) % len(order)].gpu].append(spec)
    return queues


def run_all(specs: list[RunSpec], pool: list[Slot], server: str | None = None, say=print) -> dict[str, int]:
    """Run every spec that is not done, at most one per slot at a time, each on its device (`device_queues`), writing
    through the sweep's MLflow `server`; returns counts per outcome."""
    pending = [spec for spec in specs if status(spec.folder) != "done"]
    counts = {"skipped": len(specs) - len(pending), "finished": 0, "failed": 0}
    queues = device_queues(pending, pool)
    free = interleaved(pool)
    running: dict[subprocess.Popen, tuple[RunSpec, Slot, float]] = {}
    while any(queues.values()) or running:
        for slot in list(free):
            if not queues[slot.gpu]:  # this device's runs are all started or done
                continue
            spec = queues[slot.gpu].pop(0)
            try:
                process = launch(spec, slot, server)
            except RunInUse as busy:  # a fit of its own trains it: left alone, reported failed
                record_failure(spec.folder, str(busy))
                counts["finished" if report(spec, say) else "failed"] += 1
                continue
            free.remove(slot)
            running[process] = (spec, slot, time.perf_counter())
        time.sleep(0.5)
        for process in [p for p in running if p.poll() is not None]:
            spec, slot, started = running.pop(process)
            process.log.close()
            free.append(slot)
            record_end(spec.folder, process.returncode, time.perf_counter() - started)
            counts["finished" if report(spec, say) else "failed"] += 1
    return counts


def run_launched(
    specs: list[RunSpec], sweep: Path, launcher: str, settings: list[str], server: str | None = None, say=print
) -> dict[str, int]:
    """Hand every spec that is not done to Hydra's `launcher` (one job each: `sweep_launchers.multirun`, writing
    through the sweep's MLflow `server`), wait for them all and report each from its markers; returns counts per
    outcome."""
    pending = [spec for spec in specs if status(spec.folder) != "done"]
    counts = {"skipped": len(specs) - len(pending), "finished": 0, "failed": 0}
    if not pending:
        return counts
    for spec in pending:  # an end an earlier launch recorded is not this one's
        (spec.folder / FAILED_MARKER).unlink(missing_ok=True)
    code, records = multirun(sweep, [spec.folder.name for spec in pending], launcher, settings, server)
    for spec in pending:
        counts["finished" if report(spec, say) else "failed"] += 1
    if code:
        say(f"the {launcher} launcher ended with {exit_reason(code)}; its records: {records}")
    return counts


def run_sweep(
    config: str | None,
    overrides: list[str],
    *,
    seeds: int = 1,
    parallel: int | None = None,
    threads: int = 1,
    devices: list[str] | None = None,
    out: str | None = None,
    name: str | None = None,
    print_commands: bool = False,
    launcher: str = LOCAL,
) -> int:
    """Plan, write every run's config, then run them on `launcher` (or print their commands); 0 when all finished.
    `overrides` holds the grid and, for a Hydra launcher, its `hydra.launcher.<key>=<value>` settings."""
    if threads < 1:
        raise ConfigError(f"--threads-per-run {threads}: give at least 1")
    if parallel is not None and parallel < 1:
        raise ConfigError(f"--parallel {parallel}: give at least 1")
    grid, settings = split_settings(overrides)
    check_launcher(launcher, settings, parallel=parallel, devices=devices, print_commands=print_commands)
    root = (Path(out) if out else Path(load_config(config, []).logging.output_dir) / "sweeps").resolve()
    if name is not None and (name.strip() in ("", ".", "..") or any(c in name for c in "/\\\0")):
        raise ConfigError(f"--name {name!r}: give a plain folder name (no '/' or '\\'), made inside {root}")
    name = name or sweep_name(config, grid, seeds)
    specs = plan(config, grid, seeds, root, name)
    run = None  # --print-commands: a launcher of the user's own runs them
    configure = None  # how a run's config is made for `fit`'s checks here (None: its runs go to other machines)
    if launcher != LOCAL:
        settings = launcher_settings(launcher, settings, parallel, threads, len(slots(None, threads, None)))
        check_one_process(specs, launcher)
        how = f"through Hydra's {launcher} launcher"
        run = (partial(run_launched, sweep=root / name, launcher=launcher, settings=settings), how)
        if launcher in ON_THIS_MACHINE:
            check_threads(threads)
            configure = partial(placed, threads=threads)
    elif not print_commands:
        check_threads(threads)
        if devices:  # torch is imported only to count the GPUs named
            import torch

            check_devices(devices, torch.cuda.device_count())
        check_placement(specs, devices)
        pool = slots(parallel, threads, devices)
        run = (partial(run_all, pool=pool), f"{len(pool)} at a time")
        configure = partial(placed, threads=threads, pool=pool)
    check_runs(specs, configure)
    with sweep_lock(root / name):
        return _run_locked(specs, name, root / name, seeds, threads, run, shared=configure is not None)


def _run_locked(
    specs: list[RunSpec],
    name: str,
    folder: Path,
    seeds: int,
    threads: int,
    run: tuple[Callable[..., dict[str, int]], str] | None,
    shared: bool,
) -> int:
    """`run_sweep` past its checks, under the sweep folder's lock: `run` runs the specs and says how (None: print
    their commands). `shared`: the runs run while the sweep waits, so the new ones write the sweep's store through the
    sweep's MLflow server (`sweep_store`)."""
    served = []  # the runs to do that write the sweep's store
    for spec in specs:
        if status(spec.folder) == "done":
            continue
        store = None  # a store the config names is the user's: the run writes there as `fit` would
        if spec.config.logging.tracking_uri is None:
            store = run_store(spec.folder, status(spec.folder) == "resume", shared)
        write_run_config(spec, name, threads, store)
        if store is not None:
            served.append(spec)
    if run is None:
        for spec in specs:
            print(" ".join(fit_command(spec.folder, resume=False)))
        return 0
    run_specs, how = run
    points = len({spec.point for spec in specs})
    print(f"sweep {name}: {points} grid point(s) x {seeds} seed(s) = {len(specs)} runs, {how}, in {folder}")
    if shared and served:
        # the runs that start afresh, not one a `fit` of its own trains (`run.lock`): that fit still writes its run
        fresh = [
            (spec.point, str(spec.seed))
            for spec in served
            if status(spec.folder) == "new" and run_in_use(spec.folder) is None
        ]
        check_store(folder)
        with serving(folder) as server:
            prepare_store(server, folder, {spec.config.logging.experiment for spec in served}, fresh)
            print(
                f"sweep {name}: the runs write {store_path(folder)} through MLflow's server at {server} (its log: "
                f"{folder / SERVER_LOG})"
            )
            counts = run_specs(specs, server=server)
    else:
        counts = run_specs(specs)
    print(
        f"sweep {name}: {counts['finished']} finished, {counts['skipped']} already done, {counts['failed']} failed; "
        f"compare them with: python -m ragen_lit compare {folder}"
    )
    if store_path(folder).is_file():
        print(f"sweep {name}: see them side by side in MLflow's UI: mlflow ui --backend-store-uri {store_uri(folder)}")
    if counts["failed"]:
        print(f"sweep {name}: the same command again retries the failed runs (finished runs are skipped)")
    return 1 if counts["failed"] else 0
