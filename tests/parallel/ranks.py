"""Where the multi-rank tests run: 2 gloo processes on the CPU (CI), or with `RAGEN_LIT_TEST_DEVICE=cuda` 2 NCCL
processes on 2 GPUs (`scripts/gpu_check.sh`), rank r on cuda:r and the single-process reference on cuda:0.

On the CPU the ranks must reproduce the single process to float32 rounding; on GPUs the kernels may differ with the
rows each rank holds (and NCCL sums in its own order), so the comparison there is within bfloat16's tolerance."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("RAGEN_LIT_TEST_DEVICE", "cpu")
if DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"RAGEN_LIT_TEST_DEVICE={DEVICE!r}: use cpu or cuda")
# absolute and relative tolerance of a rank's value against the single process's
TOLERANCE = (1e-6, 0.0) if DEVICE == "cpu" else (1e-5, 1.6e-2)


def require_ranks(world: int) -> None:
    """Skip when the GPU run lacks `world` GPUs (never on the CPU)."""
    if DEVICE == "cuda" and torch.cuda.device_count() < world:
        pytest.skip(f"RAGEN_LIT_TEST_DEVICE=cuda needs {world} GPUs")


def reference_device() -> torch.device:
    return torch.device("cuda", 0) if DEVICE == "cuda" else torch.device("cpu")


def init_rank(rank: int, world: int, port: int) -> torch.device:
    """Join the process group of `world` ranks on 127.0.0.1:`port`; returns this rank's device."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if DEVICE == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    init = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", init_method=init, rank=rank, world_size=world)
    return device


def close(got: float, want: float, rel: float = 0.0) -> bool:
    """One scalar within the device's tolerance (relative to at least 1 on the CPU, as the metrics are), or within
    `rel` of `want` (norms summed over many terms round more)."""
    atol, rtol = TOLERANCE
    return abs(got - want) <= max(atol * max(1.0, abs(want)), max(rtol, rel) * abs(want))


def assert_close(got: torch.Tensor, want: torch.Tensor, msg: str) -> None:
    atol, rtol = TOLERANCE
    torch.testing.assert_close(got.cpu(), want.cpu(), atol=atol, rtol=rtol, msg=msg)
