"""Kernel-level profiles for the GPU benchmarks: one region run under `torch.profiler`, its CUDA kernels'
device time summed by family (matmul, attention, …), the device's busy fraction of the region's wall time
(low: the host, not the GPU, bounds it) and the top kernels. Kernels replayed from CUDA graphs are recorded
one by one like eager ones."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable

import torch

KERNEL_FAMILIES = (  # first match wins; names of cuBLAS/CUTLASS/cuDNN/triton kernels
    ("attention", re.compile(r"flash|fmha|cudnn|attn|sdpa", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|sm\d+_|cublas|splitk", re.IGNORECASE)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.IGNORECASE)),
    ("triton fused", re.compile(r"^triton_", re.IGNORECASE)),
    ("reduction/index", re.compile(r"reduce|index|scatter|gather|embedding|sort|cumsum|nonzero", re.IGNORECASE)),
    ("copy", re.compile(r"copy|memcpy|memset|cat", re.IGNORECASE)),
)


def kernel_breakdown(prof, wall_s: float, top: int) -> dict:
    """Device time per kernel family, busy fraction of `wall_s`, kernel count, the `top` kernels by device
    time and the `top` host operators by self time, from a finished `torch.profiler.profile`."""
    per_kernel: dict[str, float] = defaultdict(float)
    per_host_op: dict[str, float] = defaultdict(float)
    launches = 0
    for event in prof.events():
        # user annotations (e.g. `Optimizer.step#AdamW.step`) span kernels already counted
        if event.device_type == torch.autograd.DeviceType.CUDA and not getattr(event, "is_user_annotation", False):
            per_kernel[event.name] += event.device_time_total / 1e6  # microseconds → seconds
            launches += 1
        elif event.device_type == torch.autograd.DeviceType.CPU:
            per_host_op[event.name] += event.self_cpu_time_total / 1e6
    families: dict[str, float] = defaultdict(float)
    for name, seconds in per_kernel.items():
        family = next((f for f, pattern in KERNEL_FAMILIES if pattern.search(name)), "other element-wise")
        families[family] += seconds
    busy = sum(per_kernel.values())
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]
    return {
        "wall_s": wall_s,
        "device_busy_s": busy,
        "busy_fraction": busy / wall_s if wall_s else float("nan"),
        "kernels": launches,
        "families_s": dict(sorted(families.items(), key=lambda kv: -kv[1])),
        "top_kernels": [(name[:110], seconds) for name, seconds in ranked],
        # where the host's time went (self time of each operator or Python-side region): for a region that
        # the device waits on, the launches and Python between kernels
        "host_s": sum(per_host_op.values()),
        "top_host_ops": [
            (name[:110], seconds) for name, seconds in sorted(per_host_op.items(), key=lambda kv: -kv[1])[:top]
        ],
    }


def start_profiler(device: torch.device) -> torch.profiler.profile:
    """A started profiler of host and (on a GPU) CUDA activity, for a region that `stop_profiler` ends."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()
    return profiler


def stop_profiler(profiler: torch.profiler.profile, wall_s: float, top: int = 15) -> dict:
    """Stop a `start_profiler` profiler; the `kernel_breakdown` of its region, which took `wall_s` (measured by
    the caller with the device synchronised at both ends)."""
    profiler.stop()
    return kernel_breakdown(profiler, wall_s, top)


def profile_region(run: Callable[[], object], device: torch.device, top: int = 15) -> dict:
    """Run `run()` once under the profiler (CUDA kernels too on a GPU), synchronised at both ends; its
    `kernel_breakdown`."""
    profiler = start_profiler(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return stop_profiler(profiler, time.perf_counter() - start, top)


def format_breakdown(label: str, profile: dict) -> list[str]:
    """Report lines of one `kernel_breakdown`: wall and busy time, the families, the top kernels and host
    operators."""
    wall = f"{label}: wall {profile['wall_s'] * 1e3:.1f} ms"
    if not profile["device_busy_s"]:
        return [f"{wall} (no CUDA kernels recorded: CPU run)"]
    lines = [
        f"{wall}, device busy {profile['device_busy_s'] * 1e3:.1f} ms ({profile['busy_fraction']:.0%}), "
        f"{profile['kernels']} kernels"
    ]
    lines += [
        f"  {family:20s} {seconds * 1e3:8.1f} ms  {seconds / profile['device_busy_s']:6.1%}"
        for family, seconds in profile["families_s"].items()
    ]
    top = [f"  {seconds * 1e3:8.1f} ms  {name}" for name, seconds in profile["top_kernels"]]
    host = [f"  {seconds * 1e3:8.1f} ms  {name}" for name, seconds in profile["top_host_ops"]]
    return [
        *lines,
        "  top kernels:",
        *top,
        f"  top host operators (self time; {profile['host_s'] * 1e3:.0f} ms in all):",
        *host,
    ]
