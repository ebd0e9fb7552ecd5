"""The idle-gap account of a profile (`bench.profiling.idle_gaps`), on hand-made kernel timelines."""

import pytest
import torch

from bench.profiling import idle_gaps, profile_region


def test_idle_gaps_sums_gaps_by_size_and_names_the_host_region_open_in_each():
    kernels = [
        (12.0, 20.0, "b"),  # 2 us after a's end: a graph's tail
        (0.0, 10.0, "a"),
        (5.0, 8.0, "c"),  # inside a: no gap of its own
        (100.0, 110.0, "d"),  # 80 us after b
        (2000.0, 2010.0, "e"),  # 1,890 us after d
    ]
    regions = [(0.0, 3000.0, "ragen/outer"), (1000.0, 1500.0, "ragen/inner")]
    idle = idle_gaps(kernels, regions, top=5)
    assert idle["by_size"]["<5us"] == (pytest.approx(2e-6), 1)
    assert idle["by_size"]["5-50us"] == (0.0, 0)
    assert idle["by_size"]["50us-1ms"] == (pytest.approx(80e-6), 1)
    assert idle["by_size"][">=1ms"] == (pytest.approx(1890e-6), 1)
    # the long gap's middle (1,055 us) lies in both regions: the inner one, opened last, names it
    assert idle["by_region_s"] == {"ragen/inner": pytest.approx(1890e-6), "ragen/outer": pytest.approx(80e-6)}
    assert [(round(s * 1e6), before, after) for s, before, after in idle["longest"]] == [
        (1890, "d", "e"),
        (80, "b", "d"),
    ]


def test_a_gap_behind_a_long_kernel_counts_from_its_end_and_gaps_outside_regions_are_none():
    # c ends after b: the device is busy until 30, so d's gap is 70 us (not 90) and follows c
    kernels = [(0.0, 30.0, "c"), (5.0, 10.0, "b"), (100.0, 101.0, "d")]
    idle = idle_gaps(kernels, [(500.0, 600.0, "ragen/later")], top=1)
    assert idle["by_size"]["50us-1ms"] == (pytest.approx(70e-6), 1)
    assert idle["by_region_s"] == {"(none)": pytest.approx(70e-6)}
    assert idle["longest"] == [(pytest.approx(70e-6), "c", "d")]


def test_a_cpu_profile_has_no_kernels_and_no_idle_time():
    profile = profile_region(lambda: torch.ones(64).sum(), torch.device("cpu"))
    assert profile["kernels"] == 0
    assert all(seconds == 0.0 and count == 0 for seconds, count in profile["idle"]["by_size"].values())
