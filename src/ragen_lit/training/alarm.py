"""`diagnostics.on_collapse`: feed each iteration's diagnostics to the template-collapse alarm
(`metrics.alarm.CollapseAlarm`), log `collapse/alarm`, warn when it fires, and with `stop` end the run cleanly.

One alarm at two layers: `metrics.alarm` is the detector (its definition and defaults), this module its Lightning
side in `fit`."""

from __future__ import annotations

import lightning as L

from ragen_lit.config import DiagnosticsConfig
from ragen_lit.metrics.alarm import CollapseAlarm
from ragen_lit.training.callbacks import IterationLogger


class CollapseAlarmCallback(L.Callback):
    """Reads the metrics `IterationLogger` gathered for the iteration (already averaged over ranks, so every
    rank takes the same decision), so it must follow `IterationLogger` in the callbacks list; Lightning runs
    `ModelCheckpoint` after both (monitoring callbacks run last in `on_train_epoch_end`). It acts once
    when the alarm turns on (console line; with `stop` a checkpoint of this iteration and `should_stop`) and
    again only after the alarm has cleared. The detector's state is checkpointed with this callback.

    `d`: the `diagnostics` section (`on_collapse` and the alarm's settings); `checkpoint_every`: the run's
    `trainer.checkpoint_every` (an iteration checkpointed anyway needs no checkpoint of the alarm's own)."""

    def __init__(self, d: DiagnosticsConfig, checkpoint_every: int):
        self.mode, self.checkpoint_every = d.on_collapse, checkpoint_every
        self.alarm = CollapseAlarm(
            d.collapse_baseline, d.collapse_window, d.collapse_mi_fraction, d.collapse_entropy_floor
        )

    def on_train_epoch_end(self, trainer, module):
        if self.mode == "off":
            return
        iteration = trainer.current_epoch + 1
        history = next(c for c in trainer.callbacks if isinstance(c, IterationLogger)).history
        if not history or history[-1]["iteration"] != iteration:
            raise RuntimeError("CollapseAlarmCallback must come after IterationLogger in the callbacks list")
        was_on = self.alarm.on
        on = self.alarm.update(history[-1])
        if on is None:  # no diagnostics this iteration
            return
        for logger in trainer.loggers:
            logger.log_metrics({"collapse/alarm": float(on)}, step=iteration)
        if not on or was_on:
            return
        if trainer.is_global_zero:
            signal, entropy, base_signal, base_entropy = self.alarm.levels()
            print(
                f"\nwarning: template collapse at iteration {iteration}: first-turn retrieval above chance fell to "
                f"{signal:.3g} from {base_signal:.3g} (means over {self.alarm.window} and the first "
                f"{self.alarm.baseline} diagnostics) while H(Z|X) held at {entropy:.3g} against {base_entropy:.3g} "
                f"(diagnostics.on_collapse={self.mode}{'; stopping' if self.mode == 'stop' else ''})"
            )
        if self.mode == "stop":
            self._checkpoint_this_iteration(trainer)
            trainer.should_stop = True

    def _checkpoint_this_iteration(self, trainer) -> None:
        """Write `ModelCheckpoint`'s last.ckpt now unless it writes this iteration itself (it runs after this hook,
        and its save_last follows only its every-n-iterations saves: at iteration 7 of checkpoint_every=5 its
        last.ckpt would stay at iteration 5). Naming the file its `last_model_path` keeps it from writing its
        end-of-training copy beside ours as last-v1.ckpt (it may still rewrite last.ckpt then)."""
        checkpoints = trainer.checkpoint_callback
        if checkpoints is None or (trainer.current_epoch + 1) % self.checkpoint_every == 0:
            return
        path = checkpoints.format_checkpoint_name({}, checkpoints.CHECKPOINT_NAME_LAST)
        trainer.save_checkpoint(path)
        checkpoints.last_model_path = path

    def state_dict(self):
        return self.alarm.state_dict()

    def load_state_dict(self, state_dict):
        self.alarm.load_state_dict(state_dict)
