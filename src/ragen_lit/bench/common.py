"""What the benchmarks share: the shipped config they run, progress lines, the device line of their tables,
the update's model-FLOP count, and a per-phase clock. Only torch is imported here, so a benchmark's
measuring subprocess stays light.

The benchmarks run from a source checkout: `conf/` is not part of the installed package.
"""

from __future__ import annotations

import platform
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

PEAK_FLOPS = 989e12  # H100 SXM, dense bf16
REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "conf" / "frozenlake.yaml"
STARTED = time.perf_counter()
# --smoke of the step and update benchmarks: a batch small enough for a CPU
SMOKE_OVERRIDES = [
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "optim.num_minibatches=2",
    "optim.micro_batch_size=4",
    "diagnostics.num_samples=4",
    "trainer.threads=1",
]


def progress(message: str) -> None:
    """A progress line with the seconds since the benchmark started, flushed at once (a run cut short by a
    timeout still shows how far it got)."""
    print(f"[bench {time.perf_counter() - STARTED:7.1f}s] {message}", flush=True)


def device_name(device: torch.device) -> str:
    """The GPU's name, or `CPU (<processor>)`."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


def update_flops(config, minibatches, policy_params: int, critic_params: int | None) -> tuple[float, float]:
    """(model FLOPs of one pass over `minibatches`, the naive 6·N·tokens + attention count with N the full
    parameter count of each model). Per sequence of s real tokens of which h are scored (response tokens),
    L layers, width d, vocabulary V: policy `6·(N − V·d)·s + 6·V·d·h + 12·L·d·s²`, critic
    `6·(N_c − V·d)·s + 12·L·d·s²` (N: parameter count; the tied embedding is a lookup, the head runs on
    scored positions only; attention counted PaLM-style as the full s×s score matrix, forward + backward).
    Padding and recomputation are not counted."""
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    exact = naive = 0.0
    for mb in minibatches:
        mask = mb["attention_mask"].bool()
        lengths = mask.sum(-1).double()
        tokens = float(lengths.sum())
        scored = float((mb["loss_mask"][:, 1:].bool() & mask[:, :-1]).sum())
        attention = 12.0 * layers * d * float((lengths**2).sum())
        exact += 6.0 * (policy_params - vocab * d) * tokens + 6.0 * vocab * d * scored + attention
        naive += 6.0 * policy_params * tokens + attention
        if critic_params is not None:
            exact += 6.0 * (critic_params - vocab * d) * tokens + attention
            naive += 6.0 * critic_params * tokens + attention
    return exact, naive


class Clock:
    """Wall seconds per (iteration, phase) and peak allocated GPU bytes per phase; the device is
    synchronised at both ends of a phase so that queued kernels are charged to the phase that issued them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.peak_bytes: dict[str, int] = defaultdict(int)
        # the caching allocator's failed-then-retried allocations (it freed its cache and synchronised)
        self.alloc_retries: dict[str, int] = defaultdict(int)
        self._started: dict[str, float] = {}
        self._retries_at_start: dict[str, int] = {}

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self, name: str) -> None:
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._retries_at_start[name] = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
        self._started[name] = time.perf_counter()

    def stop(self, name: str, iteration: int) -> float:
        self.sync()
        elapsed = time.perf_counter() - self._started.pop(name)
        self.seconds[iteration][name] += elapsed
        if self.device.type == "cuda":
            self.peak_bytes[name] = max(self.peak_bytes[name], torch.cuda.max_memory_allocated(self.device))
            retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
            self.alloc_retries[name] += retries - self._retries_at_start.pop(name)
        return elapsed

    @contextmanager
    def phase(self, name: str, iteration: int = -1):
        self.start(name)
        try:
            yield
        finally:
            self.stop(name, iteration)
