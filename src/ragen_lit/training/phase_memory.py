"""Peak GPU memory of each phase of an iteration, logged beside the phase clocks.

`time/<phase>_s` says how long generation, diagnostics, prepare and the update took; `memory/<phase>_peak_gib`
says how much GPU memory each allocated at its peak (`torch.cuda.max_memory_allocated`, counted from the
phase's start). Over ranks the largest value is kept (`parallel.collectives.combine_rank_metrics`): the rank
closest to running out is the one that matters. Off CUDA nothing is logged.
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
