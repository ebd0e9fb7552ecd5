import json

import pytest

from bench.scaling import ScalingRow, add_efficiency, format_table, main, scaling_row


def test_a_row_averages_the_iterations_after_the_first_and_counts_tokens_per_device():
    metrics = {
        "time/iteration_s": [(1, 99.0), (2, 4.0), (3, 6.0)],  # iteration 1 (warm-up) left out: mean 5 s
        "time/generation_s": [(1, 50.0), (2, 2.0), (3, 2.0)],
        "time/update_s": [(1, 40.0), (2, 1.0), (3, 3.0)],
        "rollout/sequence_tokens": [(1, 7.0), (2, 100.0), (3, 300.0)],  # mean 200 tokens per episode
    }
    row = scaling_row("ddp", 2, 256, metrics)
    assert (row.step_s, row.generation_s, row.update_s) == (5.0, 2.0, 2.0)
    assert row.tokens_per_s == 200 * 256 / 5.0  # 10,240
    assert row.tokens_per_s_per_device == 200 * 256 / 5.0 / 2
    assert (row.generation_peak_gib, row.update_peak_gib) == (None, None)  # not logged: a CPU run
    with pytest.raises(ValueError, match="at least 2 iterations"):
        scaling_row("ddp", 1, 128, {key: history[:1] for key, history in metrics.items()})


def test_a_row_reports_the_largest_phase_peaks_over_all_iterations():
    metrics = {
        "time/iteration_s": [(1, 9.0), (2, 4.0)],
        "time/generation_s": [(1, 5.0), (2, 2.0)],
        "time/update_s": [(1, 3.0), (2, 1.0)],
        "rollout/sequence_tokens": [(1, 10.0), (2, 10.0)],
        "memory/generation_peak_gib": [(1, 30.5), (2, 30.0)],  # the warm-up iteration counts: a run must fit it
        "memory/update_peak_gib": [(1, 40.0), (2, 42.25)],
    }
    row = scaling_row("fsdp", 4, 128, metrics)
    assert (row.generation_peak_gib, row.update_peak_gib) == (30.5, 42.25)
    assert format_table([row]).splitlines()[-1].endswith("| – | 30.5 | 42.2 | – | – |")


def test_a_row_reports_the_ranks_token_imbalance_and_the_gradient_sum_where_logged():
    metrics = {
        "time/iteration_s": [(1, 9.0), (2, 4.0), (3, 4.0)],
        "time/generation_s": [(1, 5.0), (2, 2.0), (3, 2.0)],
        "time/update_s": [(1, 3.0), (2, 1.0), (3, 1.0)],
        "rollout/sequence_tokens": [(1, 10.0), (2, 10.0), (3, 10.0)],
        "parallel/token_imbalance": [(1, 2.0), (2, 1.05), (3, 1.15)],
        "time/gradient_sum_s": [(1, 1.0), (2, 0.02), (3, 0.04)],
    }
    row = scaling_row("ddp", 4, 512, metrics)
    assert row.token_imbalance == pytest.approx(1.1) and row.gradient_sum_s == pytest.approx(0.03)
    assert format_table([row]).splitlines()[-1].endswith("| – | – | 1.100 | 0.030 |")


def test_efficiency_is_per_device_throughput_over_the_same_strategys_single_device_run():
    def row(strategy, devices, per_device):
        return ScalingRow(strategy, devices, 128 * devices, 1.0, 0.5, 0.5, per_device * devices, per_device)

    rows = [row("ddp", 1, 1000.0), row("ddp", 4, 850.0), row("fsdp", 1, 800.0), row("fsdp", 2, 720.0), row("x", 2, 1.0)]
    add_efficiency(rows)
    assert [r.efficiency for r in rows] == [1.0, 0.85, 1.0, 0.9, None]  # no one-device row for "x"


@pytest.mark.slow
def test_the_smoke_run_measures_one_and_two_cpu_ranks(tmp_path, capsys):
    out = tmp_path / "scaling.json"
    assert main(["--smoke", "--devices", "1", "2", "--strategies", "ddp", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["strategy"], r["devices"], r["episodes"]) for r in rows] == [("ddp", 1, 8), ("ddp", 2, 16)]
    assert rows[0]["efficiency"] == 1.0 and rows[1]["efficiency"] > 0
    assert "| ddp | 2 | 16 |" in capsys.readouterr().out
    assert rows[0]["token_imbalance"] is None and rows[1]["token_imbalance"] >= 1  # logged by two ranks only
    assert rows[0]["gradient_sum_s"] is None and rows[1]["gradient_sum_s"] > 0


def test_a_bad_override_is_refused_in_one_line_before_any_run(capsys):
    assert main(["--smoke", "--devices", "1", "--strategies", "ddp", "--set", "rollout.bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "rollout.bogus" in err and "Traceback" not in err
