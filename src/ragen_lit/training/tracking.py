"""Run directories, MLflow wiring and the end-of-run summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ragen_lit.checkpoints import is_sharded_checkpoint
from ragen_lit.config import Config, ConfigError, flat_dict, to_dict

STORE_NAME = "mlruns.db"
"""The default MLflow store: an sqlite file in `logging.output_dir`."""


def default_run_name(cfg: Config) -> str:
    filt = "nofilter" if cfg.filter.strategy == "none" else f"{cfg.filter.strategy}{cfg.filter.value:g}"
    return cfg.logging.run_name or f"{cfg.env.name}-{cfg.algo.name}-{filt}"


def tracking_uri(cfg: Config) -> str:
    if cfg.logging.tracking_uri:
        return cfg.logging.tracking_uri
    store = Path(cfg.logging.output_dir).resolve() / STORE_NAME
    store.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store}"


def resolve_run_dir(cfg: Config) -> tuple[Path, str | None, dict]:
    """(run directory, checkpoint to resume from, saved run info). A new run gets a fresh timestamped
    folder, so no run ever overwrites another's checkpoints; `trainer.resume=last` picks the newest run
    of the same name that has a `last.ckpt`, a path resumes that checkpoint in its own run folder.
    Under `trainer.strategy=fsdp` a checkpoint is a distributed-checkpoint *folder* (`last.ckpt/`)."""
    root = Path(cfg.logging.output_dir).resolve()
    name = default_run_name(cfg)
    resume = cfg.trainer.resume
    if resume is None:
        run_dir = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        suffix = 1
        while run_dir.exists():
            run_dir = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
            suffix += 1
        return run_dir, None, {}
    if resume == "last":
        candidates = sorted(root.glob(f"{name}-*/checkpoints/last.ckpt"), key=checkpoint_mtime)
        if not candidates:
            raise ConfigError(f"trainer.resume=last: no run named {name!r} with a last.ckpt under {root}")
        ckpt = candidates[-1]
    else:
        ckpt = Path(resume).expanduser().resolve()
        if not (ckpt.is_file() or is_sharded_checkpoint(ckpt)):
            raise ConfigError(
                f"trainer.resume={resume!r}: no such checkpoint file or folder (or use trainer.resume=last)"
            )
    if is_sharded_checkpoint(ckpt) and cfg.trainer.strategy != "fsdp":
        raise ConfigError(
            f"trainer.resume: {ckpt} is a sharded (FSDP) checkpoint folder; resume it with trainer.strategy=fsdp"
        )
    run_dir = ckpt.parent.parent
    info_path = run_dir / "run.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return run_dir, str(ckpt), info


def checkpoint_mtime(path: Path) -> float:
    """When a checkpoint was last written; a folder's own mtime misses files rewritten in place."""
    if path.is_dir():
        return max((p.stat().st_mtime for p in path.iterdir()), default=path.stat().st_mtime)
    return path.stat().st_mtime


def artifact_location(cfg: Config) -> str | None:
    """Where the experiment keeps its artifacts: `<output_dir>/artifacts` for the default sqlite store, so a
    run writes nothing outside `logging.output_dir` (MLflow's default is `./mlruns` of the current directory);
    None, i.e. MLflow's own default, under a user-given tracking URI."""
    if cfg.logging.tracking_uri:
        return None
    return (Path(cfg.logging.output_dir).resolve() / "artifacts").as_uri()


def ensure_experiment(cfg: Config) -> None:
    """Create the experiment with `artifact_location` unless it exists (an existing one keeps its location:
    MLflow cannot move it). Rank zero only: the other ranks start after it and must not race it."""
    location = artifact_location(cfg)
    if location is None:
        return
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(cfg))
    if client.get_experiment_by_name(cfg.logging.experiment) is not None:
        return
    try:
        client.create_experiment(cfg.logging.experiment, artifact_location=location)
    except MlflowException:
        # another run on the same store created it in between; any other failure still surfaces
        if client.get_experiment_by_name(cfg.logging.experiment) is None:
            raise


def make_logger(cfg: Config, run_dir: Path, info: dict):
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank == 0:
        ensure_experiment(cfg)
    logger = MLFlowLogger(
        experiment_name=cfg.logging.experiment,
        run_name=default_run_name(cfg),
        tracking_uri=tracking_uri(cfg),
        run_id=info.get("mlflow_run_id"),
        tags={str(k): str(v) for k, v in cfg.logging.tags.items()} or None,
    )
    if not info.get("mlflow_run_id"):
        logger.log_hyperparams(flat_dict(cfg))
    return logger


def write_run_info(run_dir: Path, cfg: Config, logger) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"mlflow_run_id": logger.run_id, "tracking_uri": tracking_uri(cfg), "config": to_dict(cfg)}
    (run_dir / "run.json").write_text(json.dumps(info, indent=2, default=str))


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
