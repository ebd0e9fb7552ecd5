"""GPU memory of a run: the peak of each phase of an iteration, and a cap on this process's share of its card.

`time/<phase>_s` says how long generation, diagnostics, prepare and the update took; `memory/<phase>_peak_gib`
says how much GPU memory each allocated at its peak (`torch.cuda.max_memory_allocated`, counted from the
phase's start). Over ranks the largest value is kept (`parallel.collectives.combine_rank_metrics`): the rank
closest to running out is the one that matters. Off CUDA nothing is logged.

`trainer.gpu_memory_fraction` caps what this process's allocator may hold on its GPU
(`torch.cuda.set_per_process_memory_fraction`). Runs that share a card (`sweep --devices 0,0,0`) each get an
equal share, so one that outgrows it fails alone with an out-of-memory error (and resumes from its checkpoint
when the sweep is started again) instead of taking its neighbours down.
"""

from __future__ import annotations

import torch

GIB = 2**30


def start_phase(device: torch.device) -> None:
    """Start counting a phase's peak on `device` (resets its peak-allocation counter; no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def phase_peak(device: torch.device, phase: str) -> dict[str, float]:
    """`{"memory/<phase>_peak_gib": GiB}` allocated at the peak since `start_phase(device)`; `{}` off CUDA."""
    if device.type != "cuda":
        return {}
    return {f"memory/{phase}_peak_gib": torch.cuda.max_memory_allocated(device) / GIB}


def cap_process_memory(device: torch.device, fraction: float) -> None:
    """Cap this process's allocations on `device` at `fraction` of the card's memory (0: no cap; off CUDA a no-op)."""
    if fraction > 0 and device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(fraction, device)
