"""Lightning callbacks that turn iterations into logs: per-iteration metrics, validation rollouts,
the empty-filter stop rule and a progress bar."""

from __future__ import annotations

import time

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from tqdm.auto import tqdm

from ragen_lit.agent.trajectory import rollout_metrics
from ragen_lit.config import ValidationConfig
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.training.gpu_memory import phase_peak, start_phase


def _log(trainer, metrics: dict[str, float], step: int) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


class IterationLogger(L.Callback):
    """At the end of every iteration: rollout, filter, diagnostics, update and timing metrics, logged
    with the iteration as step; also stops the run after `empty_stop_steps` (`filter.empty_stop_steps`) iterations
    in a row whose filter kept nothing, counting them in `empty_streak`. The metrics of every iteration so far
    (`history`), the streak and the run's wall time are checkpointed with this callback, so a resumed run's summary
    and figures cover the whole run and its streak goes on.

    `started`: when this process began the run (`time.perf_counter()`); `wall_s()` adds the wall time the run
    had spent up to the checkpoint it resumed from (work redone after a kill is counted once)."""

    def __init__(self, empty_stop_steps: int, started: float | None = None):
        self.empty_stop_steps = empty_stop_steps
        self.history: list[dict[str, float]] = []
        self.empty_streak = 0
        self.started = time.perf_counter() if started is None else started
        self.earlier_wall_s = 0.0
        self._epoch_started = 0.0

    def wall_s(self) -> float:
        """Wall seconds of the whole run: this process's so far plus the earlier processes' up to the checkpoint."""
        return self.earlier_wall_s + time.perf_counter() - self.started

    def on_train_epoch_start(self, trainer, module):
        self._epoch_started = time.perf_counter()
        start_phase(module.device)

    def on_train_epoch_end(self, trainer, module):
        data = trainer.datamodule
        metrics = dict(data.iteration_metrics)
        metrics.update(module.pop_step_stats())
        metrics.update(phase_peak(module.device, "update"))
        metrics = dist_utils.mean_over_ranks(metrics)
        metrics["time/update_s"] = time.perf_counter() - self._epoch_started
        metrics["time/iteration_s"] = metrics["time/update_s"] + sum(
            metrics.get(k, 0.0) for k in ("time/generation_s", "time/diagnostics_s", "time/prepare_s")
        )
        iteration = trainer.current_epoch + 1
        self.history.append({"iteration": iteration, **metrics})
        _log(trainer, metrics, step=iteration)
        if metrics.get("filter/empty", 0.0) >= 1.0:
            self.empty_streak += 1
            limit = self.empty_stop_steps
            if self.empty_streak >= limit:
                trainer.should_stop = True
                if trainer.is_global_zero:
                    print(
                        f"\nstopping: the filter kept no rollouts for {limit} iterations in a row "
                        "(filter.empty_stop_steps)"
                    )
        else:
            self.empty_streak = 0

    def state_dict(self):
        return {"empty_streak": self.empty_streak, "history": self.history, "wall_s": self.wall_s()}

    def load_state_dict(self, state_dict):
        self.empty_streak = int(state_dict.get("empty_streak", 0))
        # checkpoints written before the history was kept hold none: the summary then starts at the resume
        self.history = [dict(h) for h in state_dict.get("history", [])]
        self.earlier_wall_s = float(state_dict.get("wall_s", 0.0))

    def on_load_checkpoint(self, trainer, module, checkpoint):
        # checkpoints written before the streak moved here kept it beside the module's state
        # (`load_state_dict` runs after this hook and wins for newer ones)
        self.empty_streak = int(checkpoint.get("ragen_lit", {}).get("empty_streak", self.empty_streak))


class ValidationRollouts(L.Callback):
    """Rollouts on the fixed validation seeds at the validation temperature (the `validation` section): before the
    first update, every `validation.every_n_iterations`, and at the end. The results are checkpointed with this
    callback: a resumed run neither validates again nor adds a point where the run it continues did not validate."""

    def __init__(self, validation: ValidationConfig):
        self.validation = validation
        self.results: dict[int, dict[str, float]] = {}

    def run(self, trainer, module, iteration: int) -> dict[str, float]:
        if iteration in self.results:
            return self.results[iteration]
        v = self.validation
        rank, world = dist_utils.rank_and_world()
        seeds = list(range(v.seed + rank, v.seed + v.num_envs, world))
        bar = next((c for c in trainer.callbacks if isinstance(c, IterationProgressBar)), None)
        if bar is not None:
            bar.status(f"validating: {v.num_envs} episodes")
        started = time.perf_counter()
        trajectories = trainer.datamodule.run_rollouts(module, seeds, seeds, v.temperature, seed=v.seed)
        if bar is not None:
            bar.status(None)
        metrics = dist_utils.mean_over_ranks(rollout_metrics(trajectories, prefix="val"))
        metrics["time/validation_s"] = time.perf_counter() - started  # this rank's (rank zero's) clock
        self.results[iteration] = metrics
        _log(trainer, metrics, step=iteration)
        return metrics

    def on_train_start(self, trainer, module):
        # a resumed run starts past iteration 0: its "before the first update" point is in the restored results
        if self.validation.num_envs and trainer.current_epoch == 0:
            self.run(trainer, module, 0)

    def on_train_epoch_end(self, trainer, module):
        every = self.validation.every_n_iterations
        iteration = trainer.current_epoch + 1
        if self.validation.num_envs and every and iteration % every == 0:
            self.run(trainer, module, iteration)

    def on_train_end(self, trainer, module):
        if self.validation.num_envs:
            self.run(trainer, module, trainer.current_epoch)

    def state_dict(self):
        return {"results": self.results}

    def load_state_dict(self, state_dict):
        self.results = {int(it): dict(metrics) for it, metrics in state_dict.get("results", {}).items()}


class IterationProgressBar(L.Callback):
    """One tick per RL iteration with the numbers a user watches."""

    def __init__(self):
        self.bar = None

    @rank_zero_only
    def setup(self, trainer, module, stage):
        # made here, before the first validation (on_train_start), so that one shows as a status too
        self.bar = tqdm(total=trainer.max_epochs, desc="iterations", unit="it", dynamic_ncols=True)

    @rank_zero_only
    def on_train_start(self, trainer, module):
        self.bar.n = trainer.current_epoch  # a resumed run continues from its checkpoint's iteration
        self.bar.refresh()

    def status(self, text: str | None) -> None:
        """Show what a long step is doing in the bar's description (None: back to the plain bar)."""
        if self.bar is not None:
            self.bar.set_description(f"iterations ({text})" if text else "iterations")

    @rank_zero_only
    def on_train_epoch_end(self, trainer, module):
        self._show_metrics(trainer)
        self.bar.update(1)

    def _show_metrics(self, trainer) -> None:
        logger = next(c for c in trainer.callbacks if isinstance(c, IterationLogger))
        last = logger.history[-1] if logger.history else {}
        postfix = {
            "success": f"{last.get('rollout/success', 0):.2f}",
            "reward": f"{last.get('rollout/reward', 0):.2f}",
            "kept": f"{last.get('filter/kept_ratio', 0):.2f}",
        }
        validation = next((c for c in trainer.callbacks if isinstance(c, ValidationRollouts)), None)
        if validation and validation.results:
            postfix["val"] = f"{validation.results[max(validation.results)].get('val/success', 0):.2f}"
        self.bar.set_postfix(postfix)

    @rank_zero_only
    def on_train_end(self, trainer, module):
        if self.bar is not None:
            self._show_metrics(trainer)  # the final validation ran after the last tick
            self.bar.close()

    @rank_zero_only
    def on_exception(self, trainer, module, exception):
        """End the bar's line, so the error that stopped the run starts a line of its own."""
        if self.bar is not None:
            self.bar.close()
