"""TRL's `GRPOTrainer` timed on the step benchmark's single-turn shape (`bench_step.py --shape trl --trl`).

Same model folder, same prompts (the first-turn prompts of the benchmark's groups, as text), same shape:
`num_generations` = the group size, `max_completion_length` = the turn's token budget, one optimizer step per
generation batch of groups × group size completions (`per_device_train_batch_size` 32, or less to divide it,
times gradient accumulation), β = 0 (no reference model), bf16 on a GPU, and a random reward (the random
model's completions earn nothing real). Everything else is TRL's default. The step is the wall time between
consecutive `on_step_end` callbacks (generation, log-prob passes, forward/backward and the optimizer step);
the first step is warm-up.

TRL is not a dependency of ragen_lit: `trl_grpo_step` returns None when it is not importable.
"""

from __future__ import annotations

import importlib.util
import math
import random
import tempfile
import time

import torch
import transformers

TRL_MICRO_BATCH = 32  # per_device_train_batch_size of the reference TRL run


def trl_available() -> bool:
    return importlib.util.find_spec("trl") is not None


def _random_reward(completions, **kwargs) -> list[float]:
    return [random.random() for _ in completions]


class _StepClock(transformers.TrainerCallback):
    """Wall-clock times of the training start and of every optimizer step's end (device synchronised)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: list[float] = []

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.times = [self._now()]

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(self._now())


def trl_grpo_step(
    model_folder: str,
    prompts: list[str],
    *,
    group_size: int,
    max_new_tokens: int,
    steps: int,
    device: torch.device,
) -> dict | None:
    """Mean seconds of TRL GRPO steps 1.. (step 0 is warm-up) over `steps` steps on `prompts` (one group each),
    or None when TRL is not importable."""
    if not trl_available():
        return None
    import datasets
    import trl

    rows = len(prompts) * group_size
    per_device = math.gcd(TRL_MICRO_BATCH, rows)
    clock = _StepClock(device)
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as output_dir:
        config = trl.GRPOConfig(
            output_dir=output_dir,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=rows // per_device,
            num_generations=group_size,
            max_completion_length=max_new_tokens,
            beta=0.0,
            bf16=device.type == "cuda",
            use_cpu=device.type != "cuda",
            max_steps=steps,
            report_to="none",
            save_strategy="no",
            seed=0,
        )
        trainer = trl.GRPOTrainer(
            model=model_folder,
            reward_funcs=_random_reward,
            args=config,
            train_dataset=datasets.Dataset.from_dict({"prompt": prompts * steps}),
            processing_class=transformers.AutoTokenizer.from_pretrained(model_folder, padding_side="left"),
            callbacks=[clock],
        )
        trainer.train()
    seconds = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return {
        "version": trl.__version__,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": rows // per_device,
        "steps_s": seconds,
        "step_s": sum(seconds[1:]) / len(seconds[1:]),
    }
