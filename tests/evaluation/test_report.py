"""The text, JSON and MLflow forms of one environment's evaluation: which pass@k the console shows, and each with
its bootstrap interval."""

from __future__ import annotations

import json

import pytest

from ragen_lit.evaluation.estimators import BOOTSTRAP_RESAMPLES, mean_pass_at_k, pass_at_k_intervals
from ragen_lit.evaluation.report import EnvEvaluation, format_evaluation, shown_k

RATES = {
    "format_ok_rate": 0.9,
    "valid_turn_rate": 0.8,
    "num_turns": 2.5,
    "num_actions": 3.0,
    "reward": 0.4,
    "response_tokens": 20.0,
    "sequence_tokens": 120.0,
    "success": 0.5,
}


def _evaluation(successes: list[int], samples: int) -> EnvEvaluation:
    return EnvEvaluation(
        env="frozenlake",
        config="frozenlake.yaml",
        seeds=list(range(100, 100 + len(successes))),
        samples=samples,
        temperature=1.0,
        sampling_seed=7,
        successes=successes,
        success=sum(successes) / (len(successes) * samples),
        success_low=0.1,
        success_high=0.7,
        effective_episodes=5.0,
        pass_at={k: mean_pass_at_k(successes, samples, k) for k in range(1, samples + 1)},
        pass_at_interval=pass_at_k_intervals(successes, samples),
        rates=RATES,
        seconds=1.5,
    )


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (4, [1, 2, 3, 4]),  # every k up to 8, pass@3 included
        (8, [1, 2, 3, 4, 5, 6, 7, 8]),
        (9, [1, 2, 4, 8, 9]),  # above 8: the powers of two below K, and K
        (16, [1, 2, 4, 8, 16]),
        (100, [1, 2, 4, 8, 16, 32, 64, 100]),
    ],
)
def test_shown_k_is_every_k_up_to_8_then_powers_of_two_and_k(samples, expected):
    assert shown_k(samples) == expected


def test_console_shows_each_pass_at_k_with_its_interval():
    result = _evaluation([1, 0, 2, 4, 0, 3], 4)
    lines = format_evaluation(result).splitlines()
    passes = [line for line in lines if line.lstrip().startswith("pass@")]
    assert [line.split()[0] for line in passes] == ["pass@1", "pass@2", "pass@3", "pass@4"]
    for k, line in zip(range(1, 5), passes):
        low, high = result.pass_at_interval[k]
        assert line.startswith(f"  pass@{k}  ") and f"{result.pass_at[k]:.3f}  [{low:.3f}, {high:.3f}]" in line
    # the values line up under the success line's; the first line says what the interval is
    success = next(line for line in lines if line.lstrip().startswith("success"))
    assert all(line.index(".") == success.index(".") for line in passes)
    assert passes[0].endswith(f"(95% interval, {BOOTSTRAP_RESAMPLES} bootstrap resamples of the 6 episodes)")
    assert all(line.endswith("]") for line in passes[1:])


def test_console_of_many_samples_stays_short():
    lines = format_evaluation(_evaluation([3, 0, 40, 100], 100)).splitlines()
    shown = [line.split()[0] for line in lines if line.lstrip().startswith("pass@")]
    assert shown == [f"pass@{k}" for k in (1, 2, 4, 8, 16, 32, 64, 100)]


def test_json_and_mlflow_hold_every_interval_keyed_like_pass_at():
    result = _evaluation([1, 0, 2], 3)
    record = json.loads(json.dumps(result.to_json()))
    assert list(record["pass_at_interval"]) == list(record["pass_at"]) == ["1", "2", "3"]
    for k in (1, 2, 3):
        low, high = record["pass_at_interval"][str(k)]
        assert [low, high] == list(result.pass_at_interval[k])
        assert low <= record["pass_at"][str(k)] <= high
    metrics = result.metrics()
    for k in (1, 2, 3):
        assert (metrics[f"eval/pass_at_{k}_low"], metrics[f"eval/pass_at_{k}_high"]) == result.pass_at_interval[k]
        assert metrics[f"eval/pass_at_{k}"] == result.pass_at[k]
