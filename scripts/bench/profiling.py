"""Kernel-level profiles for the GPU benchmarks: one region run under `torch.profiler`, its CUDA kernels'
device time summed by family (matmul, attention, …), the device's busy fraction of the region's wall time
(low: the host, not the GPU, bounds it), where the device idled (`idle_gaps`) and the top kernels. Kernels
replayed from CUDA graphs are recorded one by one like eager ones."""

from __future__ import annotations

import bisect
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
# Idle-gap classes by their upper bound in microseconds: the tails between the kernels of a graph or a fused
# sequence, short host delays between launches, longer ones, and stalls where the host did other work
GAP_CLASSES = {"<5us": 5.0, "5-50us": 50.0, "50us-1ms": 1000.0, ">=1ms": float("inf")}
# gaps at least this long (microseconds) are attributed to the host region open during them
REGION_GAP_US = 50.0
# host regions that name what the host did while the device idled: `torch.profiler.record_function` names
REGION_PREFIX = "ragen/"


def idle_gaps(kernels: list[tuple[float, float, str]], regions: list[tuple[float, float, str]], top: int) -> dict:
    """Where the device idled between its kernels.

    `kernels`: (start, end, name) of every device kernel (microseconds, any order; overlapping kernels count
    once). `regions`: (start, end, name) of the host's annotated regions on the same clock. Returns the idle
    seconds by gap size (`GAP_CLASSES`) with their counts, the idle seconds of the gaps of at least `REGION_GAP_US`
    by the innermost region open at the gap's middle (the one that started last; "(none)" outside every region),
    and the `top` longest of those gaps with the kernels either side.
    """
    labels, bounds = list(GAP_CLASSES), list(GAP_CLASSES.values())
    by_size = {label: [0.0, 0] for label in labels}
    by_region: dict[str, float] = defaultdict(float)
    gaps: list[tuple[float, str, str]] = []
    ordered = sorted(kernels)
    for (start, _, name_after), (reach, name_before) in zip(ordered[1:], _busy_until(ordered)):
        gap = start - reach
        if gap <= 0:
            continue
        label = labels[bisect.bisect_right(bounds, gap)]
        by_size[label][0] += gap / 1e6
        by_size[label][1] += 1
        if gap >= REGION_GAP_US:
            middle = reach + gap / 2
            open_regions = [r for r in regions if r[0] <= middle <= r[1]]
            region = max(open_regions)[2] if open_regions else "(none)"
            by_region[region] += gap / 1e6
            gaps.append((gap / 1e6, name_before[:60], name_after[:60]))
    return {
        "by_size": {label: (seconds, count) for label, (seconds, count) in by_size.items()},
        "by_region_s": dict(sorted(by_region.items(), key=lambda kv: -kv[1])),
        "longest": sorted(gaps, reverse=True)[:top],
    }


def _busy_until(ordered: list[tuple[float, float, str]]) -> list[tuple[float, str]]:
    """For kernels sorted by start: the latest end among each kernel and all before it (where the device is
    busy up to when the next kernel starts), and the name of the kernel that ends there."""
    latest, out = (float("-inf"), ""), []
    for _, end, name in ordered:
        latest = max(latest, (end, name))
        out.append(latest)
    return out


def kernel_breakdown(prof, wall_s: float, top: int) -> dict:
    """Device time per kernel family, busy fraction of `wall_s`, kernel count, the `top` kernels by device
    time and the `top` host operators by self time, from a finished `torch.profiler.profile`."""
    per_kernel: dict[str, float] = defaultdict(float)
    per_host_op: dict[str, float] = defaultdict(float)
    kernels: list[tuple[float, float, str]] = []
    regions: list[tuple[float, float, str]] = []
    for event in prof.events():
        # user annotations (e.g. `Optimizer.step#AdamW.step`) span kernels already counted
        if event.device_type == torch.autograd.DeviceType.CUDA and not getattr(event, "is_user_annotation", False):
            per_kernel[event.name] += event.device_time_total / 1e6  # microseconds → seconds
            kernels.append((event.time_range.start, event.time_range.end, event.name))
        elif event.device_type == torch.autograd.DeviceType.CPU:
            per_host_op[event.name] += event.self_cpu_time_total / 1e6
            if event.name.startswith(REGION_PREFIX):
                regions.append((event.time_range.start, event.time_range.end, event.name))
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
        "kernels": len(kernels),
        "families_s": dict(sorted(families.items(), key=lambda kv: -kv[1])),
        "top_kernels": [(name[:110], seconds) for name, seconds in ranked],
        "idle": idle_gaps(kernels, regions, top),
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
    idle = profile["idle"]
    idle_lines = [
        "  device idle by gap size: "
        + ", ".join(f"{label} {seconds * 1e3:.1f} ms ({count})" for label, (seconds, count) in idle["by_size"].items()),
        f"  idle in gaps >= {REGION_GAP_US:.0f}us, by the host region open then:",
        *[f"  {seconds * 1e3:8.1f} ms  {region}" for region, seconds in idle["by_region_s"].items()],
        "  longest gaps (the kernel before -> the kernel after):",
        *[f"  {seconds * 1e3:8.2f} ms  {before} -> {after}" for seconds, before, after in idle["longest"]],
    ]
    return [
        *lines,
        *idle_lines,
        "  top kernels:",
        *top,
        f"  top host operators (self time; {profile['host_s'] * 1e3:.0f} ms in all):",
        *host,
    ]
