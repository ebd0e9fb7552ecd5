"""`sweep --launcher joblib|submitit_local|submitit_slurm`: a planned sweep's runs handed to Hydra's launcher plugins.

`sweep` plans the grid, refuses a bad one, writes every run's `config.yaml` and holds the sweep folder's lock as it does
for its own process pool (`--launcher local`, the default); then one Hydra multirun of `ragen_lit.analysis.sweep_app`
(`multirun`) gets the runs not yet done, one job per run. A job's task decides resume or a clean start as the pool does,
runs the `fit` as a child process writing to the run's `sweep.log`, and leaves the run's done or failed marker
(`sweep_run`), from which `sweep` reports every run once the launcher returns.

Launcher settings are Hydra's own words among the sweep's overrides, `hydra.launcher.<key>=<value>` (e.g.
`hydra.launcher.partition=gpu hydra.launcher.timeout_min=1440`): they are checked against the plugin's config before
any run starts (`launcher_settings`) and are not part of the grid, so they do not change the sweep's name.
`--parallel` maps to joblib's `n_jobs` (default: CPU cores / `--threads-per-run`, as the pool) and to SLURM's
`array_parallelism`; `--threads-per-run` to submitit's `cpus_per_task` unless it is set. The plugins are optional
dependencies (`pip install 'ragen_lit[launchers]'`); a missing one is named before anything runs.

A job is one process running one `fit` (one SLURM task): runs of several processes (`trainer.devices` > 1 under
SLURM, several nodes) go to a cluster through `sweep --print-commands`, one `srun` each.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from ragen_lit.analysis.sweep_run import SWEEP_ENV, child_setup
from ragen_lit.config.overrides import parse_overrides, quoted_value
from ragen_lit.errors import ConfigError

LOCAL = "local"
PLUGINS = {
    "joblib": "hydra_plugins.hydra_joblib_launcher",
    "submitit_local": "hydra_plugins.hydra_submitit_launcher",
    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher",
}
"""the Hydra launcher plugin behind each `--launcher` name (the name is the plugin's `hydra/launcher` option)"""
ON_THIS_MACHINE = ("joblib", "submitit_local")
"""the plugins whose jobs run on this machine (checked here as the pool's runs are; they end with the sweep)"""
LAUNCHERS = (LOCAL, *PLUGINS)
EXTRA = "pip install 'ragen_lit[launchers]'"
RECORDS = "hydra"
"""the folder in a sweep's folder that keeps each launch's Hydra and submitit records (`<sweep>/hydra/<time>/`)"""
PARALLEL_KEY = {"joblib": "n_jobs", "submitit_slurm": "array_parallelism"}
"""the plugin setting `--parallel` maps to (submitit_local starts every job at once: it has none)"""
QUIET = ("hydra/hydra_logging=none", "hydra.job_logging.root.handlers=[file]")
"""Hydra's logging in a sweep's multirun: none of its own (`hydra_logging/none`: the launcher's INFO lines, `Launching
jobs` and one per job, are not printed; warnings still reach stderr), and a job's log to its file alone
(`<records>/<run>/<sweep name>.log`, job_logging's `file` handler without its `console` one), so that the console
shows each run once, in `sweep`'s own `done`/`FAILED` line"""
ONE_PROCESS = ("tasks_per_node", "nodes")
"""submitit settings that would run a job's task, and with it the run's `fit`, several times at once"""
AT_LEAST = {
    "timeout_min": (1, "the job's time limit, in minutes"),
    "cpus_per_task": (1, "the job's CPU cores"),
    "cpus_per_gpu": (1, "CPU cores per GPU"),
    "gpus_per_task": (1, "GPUs per task"),
    "tasks_per_node": (1, "processes of the job on each node"),
    "nodes": (1, "nodes of the job"),
    "array_parallelism": (1, "jobs at a time"),
    "gpus_per_node": (0, "GPUs of the job on each node"),
    "mem_gb": (0, "the job's memory in GB; 0: all of a node's, as SLURM reads it"),
    "signal_delay_s": (0, "seconds between the warning signal and the time limit"),
    "max_num_timeout": (0, "times a job that timed out is requeued"),
    "verbose": (0, "joblib's progress messages"),
    "timeout": (1e-9, "a job's time limit"),
}
"""the least value each numeric setting of the plugins' config dataclasses (`JobLibLauncherConf`, `SlurmQueueConf`,
`LocalQueueConf`: they give the types, which Hydra checks) means something at, and what it means; any other number
must be >= 0, and joblib's `n_jobs` other than 0 (-1: every core)"""


def setting_key(word: str) -> str:
    """`hydra.launcher.partition` of `hydra.launcher.partition=gpu` (and of `+hydra...`, `++hydra...`)."""
    return word.split("=", 1)[0].lstrip("+~")


def split_settings(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the grid: the sweep's overrides, the launcher settings: the words for Hydra, `hydra.<key>=...`)."""
    settings = [word for word in overrides if setting_key(word).startswith(("hydra.", "hydra/"))]
    return [word for word in overrides if word not in settings], settings


def check_launcher(
    launcher: str, settings: list[str], *, parallel: int | None, devices: list[str] | None, print_commands: bool
) -> None:
    """Refuse, in one line and before anything is written, a launcher this install lacks and flags that do not apply
    to it."""
    if launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher {launcher}: no such launcher; choose one of {', '.join(LAUNCHERS)}")
    if launcher == LOCAL:
        if settings:
            raise ConfigError(
                f"{settings[0]}: launcher settings are for Hydra's launchers; add --launcher "
                f"{' or '.join(PLUGINS)}, or drop it"
            )
        return
    if importlib.util.find_spec(PLUGINS[launcher]) is None:
        raise ConfigError(f"--launcher {launcher} needs Hydra's {launcher} launcher plugin: {EXTRA}")
    if print_commands:
        raise ConfigError(
            f"--print-commands prints the runs' commands for a launcher of your own; drop it or --launcher {launcher}"
        )
    if devices:
        raise ConfigError(
            f"--devices places runs on GPUs with --launcher local only; with --launcher {launcher} a run uses the GPUs "
            "its job has (submitit: hydra.launcher.gpus_per_node=1)"
        )
    if parallel is not None and launcher not in PARALLEL_KEY:
        raise ConfigError(
            f"--parallel {parallel}: --launcher {launcher} starts every run at once; run N at a time with --launcher "
            "local or joblib"
        )
    for word in settings:
        if not setting_key(word).startswith("hydra.launcher."):
            raise ConfigError(
                f"{word}: the sweep sets Hydra's own settings and the launcher (--launcher); give launcher settings "
                "only, hydra.launcher.<key>=<value>"
            )


def launcher_settings(launcher: str, settings: list[str], parallel: int | None, threads: int, cores: int) -> list[str]:
    """The settings for Hydra: `settings` checked against the plugin's config (each key, its type, one value each),
    with `--parallel` (default: `cores` runs for joblib) and `--threads-per-run` mapped onto the plugin's keys."""
    defaults = _launcher_config(launcher, [])
    given = {setting_key(word).split(".")[2] for word in settings}
    for word in settings:
        key = setting_key(word).split(".")[2]
        if key not in defaults:
            known = ", ".join(k for k in defaults if not k.startswith("_"))
            raise ConfigError(f"{word}: the {launcher} launcher has no setting {key!r}; its settings: {known}")
        (override,) = parse_overrides([word], sweeps=True)
        if override.is_sweep_override():
            raise ConfigError(
                f"{word}: a launcher setting takes one value (a comma sweeps; quote a value that has one)"
            )
    mapped = []
    key = PARALLEL_KEY.get(launcher)
    if key in given and parallel is not None:
        raise ConfigError(f"--parallel {parallel} and hydra.launcher.{key} set the same; give one")
    if key is not None and key not in given and (parallel is not None or launcher == "joblib"):
        mapped.append(f"hydra.launcher.{key}={parallel or cores}")
    if launcher.startswith("submitit") and "cpus_per_task" not in given:
        mapped.append(f"hydra.launcher.cpus_per_task={threads}")
    config = _launcher_config(launcher, [*mapped, *settings])
    _check_values(launcher, config, [*mapped, *settings])
    for key in ONE_PROCESS:
        if config.get(key, 1) != 1:
            raise ConfigError(
                f"hydra.launcher.{key}={config[key]}: a sweep's job is one process running one fit; run a grid of "
                "runs over several processes or nodes with --print-commands, one srun each"
            )
    return [*mapped, *settings]


def _check_values(launcher: str, config: dict, settings: list[str]) -> None:
    """Every number of the composed `config` in the range its setting means (`AT_LEAST`); the error names the setting
    as given among `settings`."""
    for key, value in config.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue  # None (the plugin's default), text, or an interpolation Hydra resolves in the job
        least, meaning = AT_LEAST.get(key, (0, "a count or a time"))
        if key == "n_jobs":
            if value != 0:
                continue
            allowed = "other than 0 (jobs at a time; -1: every core)"
        elif value >= least:
            continue
        else:
            allowed = f"{'> 0' if 0 < least < 1 else f'>= {least}'} ({meaning})"
        word = next((w for w in settings if setting_key(w) == f"hydra.launcher.{key}"), f"hydra.launcher.{key}={value}")
        raise ConfigError(f"{word}: the {launcher} launcher's {key} must be {allowed}")


def _launcher_config(launcher: str, settings: list[str]) -> dict:
    """The plugin's `hydra.launcher` config with `settings` applied, as Hydra composes it; ConfigError naming the
    setting it refuses."""
    from hydra import compose, initialize
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize(version_base=None, config_path=None):
            config = compose(overrides=[f"hydra/launcher={launcher}", *settings], return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        lines = [str(error).splitlines()[0]] + ([str(error.__cause__).splitlines()[0]] if error.__cause__ else [])
        raise ConfigError(f"--launcher {launcher}: {': '.join(lines)}") from None
    return OmegaConf.to_container(config.hydra.launcher, resolve=False)


def multirun_command(
    sweep: Path, runs: list[str], launcher: str, settings: list[str], records: Path, server: str | None = None
) -> list[str]:
    """`python -m ragen_lit.analysis.sweep_app --multirun ...`: one job per run folder name of `runs` in the folder
    `sweep`, Hydra's records in `records` (a job's in `<records>/<run>/`, its log included), Hydra quiet on the
    console (`QUIET`), the runs writing through the sweep's MLflow `server` (if it runs one)."""
    return [
        sys.executable,
        "-m",
        "ragen_lit.analysis.sweep_app",
        "--multirun",
        f"hydra/launcher={launcher}",
        *QUIET,
        f"hydra.sweep.dir={quoted_value(str(records))}",
        "hydra.sweep.subdir=${run}",
        f"hydra.job.name={quoted_value(sweep.name)}",
        f"sweep={quoted_value(str(sweep))}",
        "run=" + ",".join(quoted_value(run) for run in runs),
        *([f"tracking_server={quoted_value(server)}"] if server else []),
        *settings,
    ]


def multirun(
    sweep: Path, runs: list[str], launcher: str, settings: list[str], server: str | None = None
) -> tuple[int, Path]:
    """Run the runs named `runs` of the sweep folder `sweep` through Hydra's `launcher` (writing through the sweep's
    MLflow `server`, if it runs one) and wait for them all; (the multirun's exit status, the folder of its records).
    The multirun dies with this process (`child_setup`), and jobs on this machine kill their runs' fits once it ended
    (they are told its process id: `sweep_run.SWEEP_ENV`); jobs it already gave a cluster's queue stay there."""
    records = sweep / RECORDS / time.strftime("%Y%m%d-%H%M%S")
    command = multirun_command(sweep, runs, launcher, settings, records, server)
    env = {**os.environ, SWEEP_ENV: str(os.getpid())} if launcher in ON_THIS_MACHINE else None
    return subprocess.run(command, preexec_fn=child_setup, env=env, check=False).returncode, records
