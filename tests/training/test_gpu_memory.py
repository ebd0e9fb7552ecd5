"""GPU memory (`training.gpu_memory`): each phase's peak, counted from the phase's start and absent off CUDA;
the per-process cap, applied on CUDA only and only when set."""

import torch

from ragen_lit.training import gpu_memory


def test_off_cuda_nothing_is_counted_or_logged():
    cpu = torch.device("cpu")
    gpu_memory.start_phase(cpu)  # no CUDA call on a CPU run
    assert gpu_memory.phase_peak(cpu, "update") == {}


def test_on_cuda_each_phase_reports_the_peak_since_its_own_start(monkeypatch):
    """CUDA's counter stands in for a fake allocator: a phase sees its own peak, not an earlier phase's."""
    state = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: state.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: state["peak"])
    gpu = torch.device("cuda", 0)
    gpu_memory.start_phase(gpu)
    state["peak"] = 40 * 2**30  # generation allocates 40 GiB at its peak
    assert gpu_memory.phase_peak(gpu, "generation") == {"memory/generation_peak_gib": 40.0}
    gpu_memory.start_phase(gpu)
    state["peak"] = 3 * 2**29  # the next phase peaks at 1.5 GiB: the 40 GiB is not carried over
    assert gpu_memory.phase_peak(gpu, "prepare") == {"memory/prepare_peak_gib": 1.5}


def test_the_cap_is_set_on_the_runs_gpu_only_when_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device: calls.append((f, device)))
    gpu = torch.device("cuda", 0)
    gpu_memory.cap_process_memory(gpu, 0.0)  # 0: no cap
    gpu_memory.cap_process_memory(torch.device("cpu"), 0.3)  # a CPU run has no card to cap
    gpu_memory.cap_process_memory(gpu, 0.317)
    assert calls == [(0.317, gpu)]
