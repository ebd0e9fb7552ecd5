"""The memory-bandwidth roofline of decoding: how many sampled tokens per second a card could give a workload
if every decode step only read the weights once and each row's KV cache once.

A decode step feeds one token per row. It reads every weight the forward multiplies with (the input
embedding is a lookup of B rows, so it counts only where the output head shares it) and, per row, the keys
and values of every position in that row's context: `layers × kv_heads × head_dim × 2 (K and V) × dtype
bytes` per position. The workload is a list of generate calls; a call of rows with prompt lengths p_r that
sampled n_r tokens needs max_r n_r steps (a row's tokens are sequential) and its token i of row r attended
to p_r + i positions (token 0 comes from the prefill). So over the workload

    bytes = steps × weight_bytes + kv_bytes_per_position × Σ_tokens context
          = steps × (weight_bytes + kv_bytes_per_position × mean_context × mean_batch)

with mean_batch = sampled tokens / steps, and the roofline is sampled tokens × bandwidth / bytes. Prefill
is left out (it is compute-bound), as are activations, logits and sampling (small next to the cache).
The benchmarks print it (`format_roofline`) and the fraction they achieved (`format_achieved`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragen_lit.models import kv_heads_and_dim

# Peak memory bandwidth (bytes/s) by the name torch gives the card; the first key contained in the name wins.
PEAK_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),  # "NVIDIA H100 80GB HBM3": SXM
    ("H200", 4.8e12),
    ("A100-SXM4-40GB", 1.555e12),
    ("A100-PCIE-40GB", 1.555e12),
    ("A100", 2.0e12),  # the 80 GB cards (SXM4 2.04, PCIe 1.94 TB/s)
    ("L40S", 0.864e12),
    ("A10G", 0.6e12),
)


def peak_bandwidth(device_name: str) -> float | None:
    """The card's peak memory bandwidth in bytes/s from `torch.cuda.get_device_name`, or None if not in the table
    (a CPU included)."""
    for key, bandwidth in PEAK_BANDWIDTH:
        if key in device_name:
            return bandwidth
    return None


def kv_bytes_per_position(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of keys and values one context position holds across the layers."""
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def weight_bytes_read(model: torch.nn.Module) -> int:
    """Bytes of the parameters a one-token forward of `model` reads: all of them, except an input embedding
    that the output head does not share (a lookup reads a few rows of it)."""
    params = {p.data_ptr(): p for p in model.parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight.data_ptr() != embedding.data_ptr():
        total -= embedding.numel() * embedding.element_size()
    return total


@dataclass
class DecodeWorkload:
    """What the roofline needs to know of a workload's decode steps."""

    sampled_tokens: int
    steps: int  # sequential decode steps: per generate call, its longest generation
    context_sum: int  # Σ over sampled tokens of the positions attended to

    @property
    def mean_batch(self) -> float:
        return self.sampled_tokens / self.steps

    @property
    def mean_context(self) -> float:
        return self.context_sum / self.sampled_tokens


def decode_workload(calls: Sequence[tuple[Sequence[int], Sequence[int]]]) -> DecodeWorkload:
    """The workload of generate calls, each `(prompt lengths, sampled token counts)` of its rows."""
    tokens = steps = context_sum = 0
    for prompt_lengths, generated in calls:
        for p, n in zip(prompt_lengths, generated, strict=True):
            tokens += n
            context_sum += n * p + n * (n - 1) // 2  # Σ_{i<n} (p + i)
        steps += max(generated, default=0)
    return DecodeWorkload(sampled_tokens=tokens, steps=steps, context_sum=context_sum)


@dataclass
class Roofline:
    weight_bytes: int
    kv_bytes_per_step: float
    bytes_per_step: float
    mean_batch: float
    mean_context: float
    bandwidth: float | None  # bytes/s; None: card unknown
    tokens_per_s: float | None  # sampled tokens/s at the bandwidth


def roofline(workload: DecodeWorkload, weight_bytes: int, kv_per_position: int, bandwidth: float | None) -> Roofline:
    """The bytes one decode step of `workload` reads on average and the sampled tokens/s they allow at
    `bandwidth` (None when the card's bandwidth is unknown)."""
    kv_per_step = kv_per_position * workload.mean_context * workload.mean_batch
    per_step = weight_bytes + kv_per_step
    tokens_per_s = None if bandwidth is None else workload.mean_batch * bandwidth / per_step
    return Roofline(
        weight_bytes=weight_bytes,
        kv_bytes_per_step=kv_per_step,
        bytes_per_step=per_step,
        mean_batch=workload.mean_batch,
        mean_context=workload.mean_context,
        bandwidth=bandwidth,
        tokens_per_s=tokens_per_s,
    )


def model_roofline(model: torch.nn.Module, workload: DecodeWorkload, device_name: str) -> Roofline:
    """`roofline` for `model`'s weights and KV cache (in its parameters' dtype) on the card `device_name`."""
    config = model.config.get_text_config(decoder=True)
    kv_heads, head_dim = kv_heads_and_dim(model.config)
    dtype_bytes = next(model.parameters()).element_size()
    kv = kv_bytes_per_position(config.num_hidden_layers, kv_heads, head_dim, dtype_bytes)
    return roofline(workload, weight_bytes_read(model), kv, peak_bandwidth(device_name))


def format_roofline(r: Roofline) -> str:
    """One line: the byte model of a decode step, the card's bandwidth and the roofline."""
    line = (
        f"decode roofline: weights {r.weight_bytes / 1e9:.3g} GB + KV {r.kv_bytes_per_step / 1e9:.3g} GB "
        f"(mean batch {r.mean_batch:.1f} rows x mean context {r.mean_context:.0f} positions) = "
        f"{r.bytes_per_step / 1e9:.3g} GB per decode step; "
    )
    if r.bandwidth is None:
        return line + "peak bandwidth unknown for this device"
    return line + f"peak {r.bandwidth / 1e12:.2f} TB/s -> {r.tokens_per_s:.0f} sampled tokens/s"


def format_achieved(r: Roofline, achieved_tokens_per_s: float) -> str:
    """`achieved_tokens_per_s` and its fraction of the roofline (none when the bandwidth is unknown)."""
    if r.tokens_per_s is None:
        return f"{achieved_tokens_per_s:.0f} sampled tokens/s (roofline unknown)"
    fraction = achieved_tokens_per_s / r.tokens_per_s
    return f"{achieved_tokens_per_s:.0f} sampled tokens/s = {fraction:.1%} of the roofline"
