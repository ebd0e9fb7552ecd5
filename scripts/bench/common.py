"""What the benchmarks share: the shipped config they run, progress lines, the device line of their tables,
the update's model-FLOP count (LoRA-aware), and a per-phase clock. Only torch is imported here, so a benchmark's
measuring subprocess stays light.

The benchmarks run from a source checkout: `conf/` is not part of the installed package.
"""

from __future__ import annotations

import platform
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

PEAK_FLOPS = 989e12  # H100 SXM, dense bf16
REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
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


@dataclass(frozen=True)
class Weights:
    """One model's parameters as the update's FLOP count sees them."""

    total: int
    """every parameter (the tied embedding once, LoRA adapters included): each runs its forward and activation
    gradient"""
    trainable: int
    """the parameters an optimizer steps: all of them in full fine-tuning; under LoRA the adapters (and the
    critic's value head). Only these need a weight-gradient matmul"""
    embedding_trains: bool
    """the [V, d] embedding (the policy's tied head too) is among the trainable ones"""


def weights(model: torch.nn.Module, embedding: torch.nn.Module) -> Weights:
    """`model`'s `Weights`; `embedding` is its input embedding (for a critic, its backbone's)."""
    return Weights(
        total=sum(p.numel() for p in model.parameters()),
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        embedding_trains=embedding.weight.requires_grad,
    )


def module_weights(module) -> tuple[Weights, Weights | None]:
    """The `Weights` of an `AgentRLModule`'s policy and critic (None without a critic)."""
    policy = weights(module.policy, module.policy.get_input_embeddings())
    critic = module.critic
    return policy, (None if critic is None else weights(critic, critic.backbone.get_input_embeddings()))


def update_flops(config, minibatches, policy: Weights, critic: Weights | None) -> tuple[float, float]:
    """(model FLOPs of one pass over `minibatches`, the naive 6·N·tokens + attention count with N the full
    parameter count of each model, as if every weight trained).

    A weight W in a matmul costs, per token, 2·|W| forward, 2·|W| for the activation gradient (which every
    layer needs so that the gradient reaches the trainable weights below it) and 2·|W| for the weight gradient,
    which only a trainable W needs: under LoRA the frozen base weights skip it, so the update costs
    4·N + 2·T per token, not 6·N (T: trainable parameters, the adapters). Per sequence of s real tokens of
    which h are scored (response tokens), L layers, width d, vocabulary V, E = V·d, e = 1 if the embedding
    trains (full fine-tuning) else 0:
    policy `(4·(N − E) + 2·(T − e·E))·s + (4 + 2·e)·E·h + 12·L·d·s²`,
    critic `(4·(N_c − E) + 2·(T_c − e_c·E))·s + 12·L·d·s²`.
    The tied embedding is a lookup, the head runs on scored positions only; attention is counted PaLM-style
    as the full s×s score matrix, forward + backward (it has no weights: LoRA leaves it as it is). In full
    fine-tuning (T = N, e = 1) this is `6·(N − E)·s + 6·E·h + 12·L·d·s²`. Padding and recomputation are not
    counted, nor the first layer's input gradient that frozen embeddings make unnecessary."""
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    embedding = vocab * d

    def per_token(model: Weights) -> float:  # the matmuls of every position but the head's
        trained = model.trainable - embedding * model.embedding_trains
        return 4.0 * (model.total - embedding) + 2.0 * trained

    head = (4.0 + 2.0 * policy.embedding_trains) * embedding
    exact = naive = 0.0
    for mb in minibatches:
        mask = mb["attention_mask"].bool()
        lengths = mask.sum(-1).double()
        tokens = float(lengths.sum())
        scored = float((mb["loss_mask"][:, 1:].bool() & mask[:, :-1]).sum())
        attention = 12.0 * layers * d * float((lengths**2).sum())
        exact += per_token(policy) * tokens + head * scored + attention
        naive += 6.0 * policy.total * tokens + attention
        if critic is not None:
            exact += per_token(critic) * tokens + attention
            naive += 6.0 * critic.total * tokens + attention
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
