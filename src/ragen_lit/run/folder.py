"""A run's folder and its record: which folder a `fit` trains (a new one, or the one it resumes) and what `run.json`
in it holds, the resume rules and the end-of-run summary; `Run`, the run as `run.opening.open_run` opened it, which
the loggers, the callbacks and the record take instead of the config. The folder's checkpoints are
`run.checkpoints`', its lock `run.lock`'s, its MLflow store `run.store`'s.

A run folder is `<logging.output_dir>/<run name>-<date>-<time>[-<n>]` (`resolve_run_dir`), the run name
`logging.run_name` or `<env>-<algo>-<filter>` (`default_run_name`).

`run.json` holds the run's MLflow id, its store (the store itself: never the `logging.tracking_server` the process
wrote through, which is gone when a sweep's server stopped), the config it follows, one entry per resume (`resumes`:
the checkpoint, the time and the config keys the resume changed) and, once `fit` has ended, `finished` (the last
iteration, the `trainer.iterations` it was asked for and the summary). Resume rules:
- a changed config is refused unless `trainer.resume_allow_changes=true`; then the change is recorded (run.json's
  `resumes`, an MLflow tag `config_change/<key>` per key; MLflow params cannot change and keep the first values).
  `trainer.iterations` may change without the flag (raising it is how a finished run is trained further); the keys
  that only say how this process runs (`RUNTIME_KEYS`) are not compared;
- a run resumed when it has already trained `trainer.iterations` iterations says so and changes nothing.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ragen_lit.config import Config, ConfigError, LoggingConfig, TrainerConfig
from ragen_lit.run.checkpoints import CHECKPOINT_FOLDER, is_sharded_checkpoint, newest_checkpoint, recency
from ragen_lit.run.store import store_uri

# how this process runs and what it keeps on disk, not what the run computes: never compared on resume
RUNTIME_KEYS = (
    "trainer.resume",
    "trainer.resume_allow_changes",
    "trainer.threads",
    "trainer.gpu_memory_fraction",
    "trainer.timeout_minutes",
    "trainer.checkpoint_every",
    "logging.tracking_server",
    "logging.save_rollouts",
    "logging.loggers",
    "logging.wandb_mode",
)
# a resume may change them without `trainer.resume_allow_changes` (recorded all the same)
EXTENDING_KEYS = ("trainer.iterations",)
ROLLOUTS_FOLDER = "rollouts"
"""where a run folder keeps every iteration's rollouts (`logging.save_rollouts`)"""


@dataclass(frozen=True)
class Run:
    """One `fit`'s run as `run.opening.open_run` opened it: what the loggers, the callbacks and the end-of-run record
    read of it, so that none of them takes the config."""

    folder: Path
    """the run folder (`resolve_run_dir`)"""
    name: str
    """the run's name (`default_run_name`): its folder's prefix, its MLflow and W&B run name, its figures' label"""
    logging: LoggingConfig
    """where its records go: the MLflow store and experiment, the run's tags, the loggers beside MLflow"""
    iterations: int
    """`trainer.iterations` asked for now: run.json's `finished` records it"""
    checkpoint_every: int
    """`trainer.checkpoint_every`: the iterations between two checkpoints"""
    config: dict
    """the config the run follows (`config.to_dict`): run.json records it, a resume is compared with it"""
    resume_from: str | None = None
    """the checkpoint this process resumes; None for a new run"""
    record: dict = field(default_factory=dict)
    """run.json as this process found it ({} for a new run)"""
    changes: dict[str, list] = field(default_factory=dict)
    """the config changes of this resume (`check_resume`)"""
    finished: dict | None = None
    """run.json's `finished` record where the run already trained what is asked now (`finished_run`): nothing to do"""

    @property
    def checkpoints(self) -> Path:
        """The folder its checkpoints go to (`run.checkpoints`)."""
        return self.folder / CHECKPOINT_FOLDER

    @property
    def rollouts(self) -> Path | None:
        """The folder its rollouts go to under `logging.save_rollouts`; None when they are not saved."""
        return self.folder / ROLLOUTS_FOLDER if self.logging.save_rollouts else None


def default_run_name(cfg: Config) -> str:
    filt = "nofilter" if cfg.filter.strategy == "none" else f"{cfg.filter.strategy}{cfg.filter.value:g}"
    return cfg.logging.run_name or f"{cfg.env.name}-{cfg.algo.name}-{filt}"


def run_folder_pattern(name: str) -> re.Pattern:
    """The folder names `resolve_run_dir` gives the runs named `name`: `<name>-<date>-<time>[-<n>]`."""
    return re.compile(re.escape(name) + r"-\d{8}-\d{6}(-\d+)?")


def resolve_run_dir(logging: LoggingConfig, trainer: TrainerConfig, name: str) -> tuple[Path, str | None, dict]:
    """(run directory, checkpoint to resume from, saved run info) of the run `name` in `logging.output_dir`. A new
    run gets a fresh timestamped folder, so no run ever overwrites another's checkpoints; `trainer.resume=last` picks
    the newest complete checkpoint (`run.checkpoints.newest_checkpoint`: `last.ckpt` or a newer periodic one) of the
    runs of the same name, a path resumes that checkpoint in its own run folder.
    Under `trainer.strategy=fsdp` a checkpoint is a distributed-checkpoint *folder* (`last.ckpt/`)."""
    root = Path(logging.output_dir).resolve()
    resume = trainer.resume
    if resume is None:
        run_dir = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        suffix = 1
        while run_dir.exists():
            run_dir = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
            suffix += 1
        return run_dir, None, {}
    if resume == "last":
        pattern = run_folder_pattern(name)
        runs = [path for path in root.glob(f"{glob.escape(name)}-*") if pattern.fullmatch(path.name)]
        candidates = sorted((ckpt for ckpt in map(newest_checkpoint, runs) if ckpt is not None), key=recency)
        if not candidates:
            start = "start afresh with the same command without trainer.resume"
            if not runs:
                raise ConfigError(f"trainer.resume=last: no run named {name!r} under {root}; {start}")
            newest = max(runs, key=lambda run: [int(part) for part in run.name[len(name) + 1 :].split("-")])
            raise ConfigError(
                f"trainer.resume=last: no checkpoint in {newest} (the newest run named {name!r}; none of them has "
                f"written one); {start}"
            )
        ckpt = candidates[-1]
    else:
        ckpt = Path(resume).expanduser().resolve()
        if not (ckpt.is_file() or is_sharded_checkpoint(ckpt)):
            raise ConfigError(
                f"trainer.resume={resume!r}: no such checkpoint file or folder (or use trainer.resume=last)"
            )
    if is_sharded_checkpoint(ckpt) and trainer.strategy != "fsdp":
        raise ConfigError(
            f"trainer.resume: {ckpt} is a sharded (FSDP) checkpoint folder; resume it with trainer.strategy=fsdp"
        )
    run_dir = ckpt.parent.parent
    info_path = run_dir / "run.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return run_dir, str(ckpt), info


def _plain(config: dict) -> dict:
    """The config as run.json stores it (JSON values), so a saved and a new config compare equal."""
    return json.loads(json.dumps(config, default=str))


def config_changes(config: dict, info: dict) -> dict[str, list]:
    """{key: [value the run follows, value given now]} for each key of run.json's config that `config` (the config
    given now, `config.to_dict`) changes. Keys the saved config lacks (fields added since) and `RUNTIME_KEYS` are not
    compared."""
    saved, now = info.get("config") or {}, _plain(config)
    changes = {}
    for section, values in now.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            old = saved.get(section, {})
            if name not in RUNTIME_KEYS and key in old and old[key] != value:
                changes[name] = [old[key], value]
    return changes


def check_resume(config: dict, trainer: TrainerConfig, run_dir: Path, info: dict) -> dict[str, list]:
    """The config changes of this resume (`config_changes`); raises ConfigError on a change the user did not
    allow with `trainer.resume_allow_changes=true`."""
    changes = config_changes(config, info)
    refused = [key for key in changes if key not in EXTENDING_KEYS]
    if refused and not trainer.resume_allow_changes:
        key, (old, new) = refused[0], changes[refused[0]]
        more = f" (also changed: {', '.join(refused[1:])})" if len(refused) > 1 else ""
        raise ConfigError(
            f"trainer.resume: {key}={new!r} but run {run_dir.name} was trained with {key}={old!r}{more}; "
            "resume with the run's config, or pass trainer.resume_allow_changes=true to change it (recorded)"
        )
    return changes


def finished_run(iterations: int, info: dict) -> dict | None:
    """run.json's `finished` record when the run ended at or past the `iterations` (`trainer.iterations`) asked for
    now. A run a stop rule ended early (empty filter, collapse alarm) resumes: its restored state decides whether it
    stops again."""
    finished = info.get("finished")
    if finished and finished["iteration"] >= iterations:
        return finished
    return None


def finished_message(run_dir: Path, finished: dict) -> str:
    """What a resume of a finished run prints: that it changed nothing, and the run's summary."""
    return (
        f"run {run_dir.name} already finished at iteration {finished['iteration']} "
        f"(trainer.iterations={finished['iterations']}); nothing was trained or changed "
        "(raise trainer.iterations to train it further)\n\n"
        + format_summary(finished["summary"], f"ragen_lit run {run_dir.name}")
    )


def write_run_info(run: Run, logger) -> None:
    """run.json of a new run, or of a resumed one: its MLflow run (`logger`'s), the config it follows now, one more
    `resumes` entry (with the resume's changes, also set as MLflow tags `config_change/<key>`), and no `finished`
    record until it ends again."""
    run.folder.mkdir(parents=True, exist_ok=True)
    record = {k: v for k, v in run.record.items() if k != "finished"}
    record.update(mlflow_run_id=logger.run_id, tracking_uri=store_uri(run.logging), config=_plain(run.config))
    if run.resume_from is not None:
        resume = {"checkpoint": run.resume_from, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changes": run.changes}
        record["resumes"] = [*run.record.get("resumes", []), resume]
        for key, (old, new) in run.changes.items():
            logger.experiment.set_tag(logger.run_id, f"config_change/{key}", f"{old!r} -> {new!r}")
    _write_json(run.folder / "run.json", record)


def record_finished(run: Run, summary: dict[str, float]) -> None:
    """Add `finished` to run.json: a resume asking for no more iterations than it trained only says so."""
    path = run.folder / "run.json"
    record = json.loads(path.read_text())
    iteration = int(summary.get("iterations", 0))
    record["finished"] = {"iteration": iteration, "iterations": run.iterations, "summary": summary}
    _write_json(path, record)


def _write_json(path: Path, record: dict) -> None:
    """Replace `path` at once: a kill mid-write, or a rank reading it meanwhile, never meets half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=2, default=str))
    os.replace(partial, path)


def summarize(history: list[dict], validation: dict[int, dict], wall_s: float) -> dict[str, float]:
    """The numbers a user reads at the end of a run (also logged as `summary/*`)."""
    summary: dict[str, float] = {}
    if validation:
        first, last = min(validation), max(validation)
        summary["val_success_initial"] = validation[first].get("val/success", float("nan"))
        summary["val_success_final"] = validation[last].get("val/success", float("nan"))
    if history:
        tail = history[-min(3, len(history)) :]
        summary["train_success_last"] = sum(h.get("rollout/success", 0.0) for h in tail) / len(tail)
        summary["train_reward_mean"] = sum(h.get("rollout/reward", 0.0) for h in history) / len(history)
        summary["kept_ratio_mean"] = sum(h.get("filter/kept_ratio", 1.0) for h in history) / len(history)
        diag = [h for h in history if "collapse/first_turn/retrieval_acc" in h]
        if diag:
            summary["mi_retrieval_acc"] = diag[-1]["collapse/first_turn/retrieval_acc"]
            summary["mi_retrieval_chance"] = diag[-1].get("collapse/first_turn/retrieval_chance", float("nan"))
            summary["mi_est"] = diag[-1].get("collapse/first_turn/mi_est", float("nan"))
        ent = [h["actor/entropy"] for h in history if "actor/entropy" in h]
        if ent:
            summary["token_entropy_last"] = ent[-1]
        summary["iterations"] = float(history[-1]["iteration"])
    summary["wall_time_s"] = wall_s
    return summary


def format_summary(summary: dict[str, float], title: str) -> str:
    rows = [
        (
            "validation success (before → after)",
            f"{summary.get('val_success_initial', float('nan')):.3f} → "
            f"{summary.get('val_success_final', float('nan')):.3f}",
        ),
        ("train success (last 3 iterations)", f"{summary.get('train_success_last', float('nan')):.3f}"),
        ("mean episode reward", f"{summary.get('train_reward_mean', float('nan')):.3f}"),
        ("mean kept ratio (filter)", f"{summary.get('kept_ratio_mean', float('nan')):.3f}"),
        (
            "MI retrieval acc vs chance (first turn)",
            f"{summary.get('mi_retrieval_acc', float('nan')):.3f} vs "
            f"{summary.get('mi_retrieval_chance', float('nan')):.3f}",
        ),
        ("MI estimate (nats, first turn)", f"{summary.get('mi_est', float('nan')):.3f}"),
        ("token entropy (last iteration)", f"{summary.get('token_entropy_last', float('nan')):.3f}"),
        ("iterations", f"{summary.get('iterations', 0):.0f}"),
        ("wall time", f"{summary.get('wall_time_s', 0):.0f} s"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [title, "-" * (width + 24)] + [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)
