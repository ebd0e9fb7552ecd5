"""Peak GPU memory per phase (`training.phase_memory`): counted from each phase's start, absent off CUDA."""

import torch

from ragen_lit.training import phase_memory


def test_off_cuda_nothing_is_counted_or_logged():
    cpu = torch.device("cpu")
    phase_memory.start_phase(cpu)  # no CUDA call on a CPU run
    assert phase_memory.phase_peak(cpu, "update") == {}


def test_on_cuda_each_phase_reports_the_peak_since_its_own_start(monkeypatch):
    """CUDA's counter stands in for a fake allocator: a phase sees its own peak, not an earlier phase's."""
    state = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: state.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: state["peak"])
    gpu = torch.device("cuda", 0)
    phase_memory.start_phase(gpu)
    state["peak"] = 40 * 2**30  # generation allocates 40 GiB at its peak
    assert phase_memory.phase_peak(gpu, "generation") == {"memory/generation_peak_gib": 40.0}
    phase_memory.start_phase(gpu)
    state["peak"] = 3 * 2**29  # the next phase peaks at 1.5 GiB: the 40 GiB is not carried over
    assert phase_memory.phase_peak(gpu, "prepare") == {"memory/prepare_peak_gib": 1.5}
