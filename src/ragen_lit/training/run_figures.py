"""The run's own curves, drawn at the end of `fit` as PNG files: artifacts under `figures/` of its MLflow run, and
images `figures/<name>` in TensorBoard and W&B where `logging.loggers` names them (a CSV file takes no picture).

The numbers come from what the callbacks kept in memory (`IterationLogger.history`, `ValidationRollouts.results`),
the drawing from `ragen_lit.figures`, the same pictures `compare` draws for many runs. A figure whose metrics the
run did not log is skipped, and a figure that fails to draw only warns: pictures never fail a training run.
Both are checkpointed, so after a resume the figures cover the whole run (and replace the earlier files).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from matplotlib import image
from matplotlib.figure import Figure

from ragen_lit import figures
from ragen_lit.training.callbacks import IterationLogger, ValidationRollouts

ARTIFACT_DIR = "figures"
ENTROPY = "collapse/first_turn/cond_entropy"
RETRIEVAL = "collapse/first_turn/retrieval_acc"
GRAD_KEY = re.compile(r"grad/(task_norm|reg_norm|rv)/q(\d+)$")

History = Sequence[Mapping[str, float]]


def curve(history: History, key: str) -> list[tuple[float, float]]:
    """[(iteration, value)] over the iterations that logged `key`."""
    return [(h["iteration"], h[key]) for h in history if key in h]


def success_figure(history: History, validation: Mapping[int, Mapping[str, float]], label: str) -> Figure | None:
    # validation's iteration 0 is the model before the first update; an empty curve draws no line
    val = [(it, m["val/success"]) for it, m in sorted(validation.items()) if "val/success" in m]
    train = curve(history, "rollout/success")
    if not (val or train):
        return None
    groups = {"validation": [val], "train": [train]}
    return figures.curves_figure(groups, "success rate", f"success over iterations: {label}")


def filter_figure(history: History, label: str) -> Figure | None:
    kept, rv_cv = curve(history, "filter/kept_ratio"), curve(history, "filter/rv_cv")
    if not (kept or rv_cv):
        return None
    return figures.filter_curves({label: [kept]}, {label: [rv_cv]})


def mi_figure(history: History, label: str) -> Figure | None:
    path = [(h[ENTROPY], h[RETRIEVAL]) for h in history if ENTROPY in h and RETRIEVAL in h]
    if not path:
        return None
    xs, ys = zip(*path)
    return figures.mi_entropy_plane({label: [(list(xs), list(ys))]})


def gradient_figure(history: History, label: str) -> Figure | None:
    """Per RV bucket, the mean over the iterations that logged it (NaN for a bucket of the other kind only);
    the buckets' mean RV (`grad/rv/q{k}`), where logged, labels the x-axis."""
    by_kind: dict[str, dict[int, list[float]]] = {"task_norm": {}, "reg_norm": {}, "rv": {}}
    for h in history:
        for key, value in h.items():
            if m := GRAD_KEY.match(key):
                by_kind[m.group(1)].setdefault(int(m.group(2)), []).append(value)
    buckets = sorted({q for kind in ("task_norm", "reg_norm") for q in by_kind[kind]})
    if not buckets:
        return None
    means = {
        kind: [sum(v) / len(v) if (v := per_bucket.get(q)) else float("nan") for q in buckets]
        for kind, per_bucket in by_kind.items()
    }
    rv = means["rv"] if by_kind["rv"] else None
    return figures.gradient_buckets({label: means["task_norm"]}, {label: means["reg_norm"]}, rv)


def draw_run_figures(
    history: History,
    validation: Mapping[int, Mapping[str, float]],
    label: str,
    out: Path,
) -> list[Path]:
    """Write every figure the run's metrics allow into `out`; returns the files written."""
    drawers: dict[str, Callable[[], Figure | None]] = {
        "success.png": lambda: success_figure(history, validation, label),
        "kept_ratio_rv.png": lambda: filter_figure(history, label),
        "mi_vs_entropy.png": lambda: mi_figure(history, label),
        "gradient_buckets.png": lambda: gradient_figure(history, label),
    }
    written = []
    for name, draw in drawers.items():
        try:
            fig = draw()
            if fig is not None:
                written.append(figures.save_png(fig, out / name))
        except Exception as err:  # a picture is never worth a failed run
            rank_zero_warn(f"run figure {name} skipped: {type(err).__name__}: {err}")
    return written


def log_figure(logger: Logger, path: Path, step: int) -> None:
    """The figure file `path` to `logger`: an MLflow artifact under `figures/`, a TensorBoard or W&B image
    `figures/<name>` at `step`; other loggers take none."""
    tag = f"{ARTIFACT_DIR}/{path.stem}"
    if isinstance(logger, MLFlowLogger):
        logger.experiment.log_artifact(logger.run_id, str(path), ARTIFACT_DIR)
    elif isinstance(logger, TensorBoardLogger):
        logger.experiment.add_image(tag, image.imread(path), step, dataformats="HWC")
        logger.experiment.flush()
    elif isinstance(logger, WandbLogger):
        logger.log_image(tag, [str(path)], step=step)


class RunFigures(L.Callback):
    """At the end of training, on global rank zero, logs the run's figures to every logger that takes them, at the
    last iteration; `label`: the run's name, in their titles and legends."""

    def __init__(self, iteration_logger: IterationLogger, validation: ValidationRollouts, label: str):
        self.iteration_logger = iteration_logger
        self.validation = validation
        self.label = label

    def on_train_end(self, trainer, module):
        if not (trainer.is_global_zero and trainer.loggers):
            return
        with tempfile.TemporaryDirectory() as tmp:
            files = draw_run_figures(self.iteration_logger.history, self.validation.results, self.label, Path(tmp))
            for logger in trainer.loggers:
                for path in files:
                    try:
                        log_figure(logger, path, trainer.current_epoch)
                    except Exception as err:  # an unreachable store or a full disk must not fail a finished run
                        rank_zero_warn(f"run figure {path.name} not logged: {type(err).__name__}: {err}")
