"""One environment's evaluation: the numbers `evaluate` prints, writes to its JSON report and logs to MLflow.

Episodes and turns are counted as `fit` counts its validation (`agent.trajectory.rollout_metrics`): success and
reward per episode, the format rate (a reply with a `<think>…</think>` part) and the valid-action rate per turn,
tokens sampled per turn and held per episode. pass@k, its bootstrap interval over episodes and the success interval
come from `estimators`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ragen_lit.agent.trajectory import Trajectory, rollout_metrics
from ragen_lit.evaluation.estimators import (
    BOOTSTRAP_RESAMPLES,
    effective_episodes,
    mean_pass_at_k,
    pass_at_k_intervals,
    success_interval,
)

CONFIDENCE = 0.95
PREFIX = "eval"


@dataclass(frozen=True)
class EnvEvaluation:
    """What N episodes x K samples of one environment did."""

    env: str
    config: str
    """the config file (or the run's run.json) the episodes, engine and limits came from"""
    seeds: list[int]
    """the N episode seeds (maps, items), in order"""
    samples: int
    temperature: float
    sampling_seed: int
    successes: list[int]
    """per seed, how many of its K samples succeeded"""
    success: float
    success_low: float
    success_high: float
    effective_episodes: float
    """the independent episodes the interval counts (`estimators.effective_episodes`)"""
    pass_at: dict[int, float]
    """pass@k for k = 1..K (unbiased estimator)"""
    pass_at_interval: dict[int, tuple[float, float]]
    """per k, pass@k's 95% percentile bootstrap interval over the N episodes (`estimators.pass_at_k_intervals`)"""
    rates: dict[str, float]
    """`rollout_metrics` of all N x K episodes without their prefix: reward, num_turns, num_actions,
    valid_turn_rate, format_ok_rate, response_tokens (per turn), sequence_tokens (per episode), success"""
    seconds: float

    def metrics(self) -> dict[str, float]:
        """The flat `eval/*` metrics logged to MLflow."""
        logged = {f"{PREFIX}/{key}": value for key, value in self.rates.items()}
        logged.update(
            {
                f"{PREFIX}/success": self.success,
                f"{PREFIX}/success_low": self.success_low,
                f"{PREFIX}/success_high": self.success_high,
                f"{PREFIX}/episodes": float(len(self.seeds)),
                f"{PREFIX}/samples": float(self.samples),
                f"{PREFIX}/time_s": self.seconds,
            }
        )
        logged.update({f"{PREFIX}/pass_at_{k}": value for k, value in self.pass_at.items()})
        for k, (low, high) in self.pass_at_interval.items():
            logged.update({f"{PREFIX}/pass_at_{k}_low": low, f"{PREFIX}/pass_at_{k}_high": high})
        return logged

    def to_json(self) -> dict:
        record = asdict(self)
        record["pass_at"] = {str(k): v for k, v in self.pass_at.items()}
        record["pass_at_interval"] = {str(k): list(v) for k, v in self.pass_at_interval.items()}
        return record


def evaluate_trajectories(
    trajectories: Sequence[Trajectory],
    seeds: Sequence[int],
    samples: int,
    *,
    env: str,
    config: str,
    temperature: float,
    sampling_seed: int,
    seconds: float,
) -> EnvEvaluation:
    """Summarize `trajectories`: `samples` episodes of every seed in `seeds` (each trajectory's `group` is its
    seed's position in `seeds`)."""
    successes = [0] * len(seeds)
    played = [0] * len(seeds)
    for t in trajectories:
        successes[t.group] += int(t.success)
        played[t.group] += 1
    if played != [samples] * len(seeds):
        raise RuntimeError(f"expected {samples} episodes of each of {len(seeds)} seeds, got {played}")
    low, high = success_interval(successes, samples, CONFIDENCE)
    rates = {key.split("/", 1)[1]: value for key, value in rollout_metrics(trajectories, prefix=PREFIX).items()}
    return EnvEvaluation(
        env=env,
        config=config,
        seeds=list(seeds),
        samples=samples,
        temperature=temperature,
        sampling_seed=sampling_seed,
        successes=successes,
        success=sum(successes) / (len(seeds) * samples),
        success_low=low,
        success_high=high,
        effective_episodes=effective_episodes(successes, samples),
        pass_at={k: mean_pass_at_k(successes, samples, k) for k in range(1, samples + 1)},
        pass_at_interval=pass_at_k_intervals(successes, samples, CONFIDENCE),
        rates=rates,
        seconds=seconds,
    )


SHOWN_ALL_UP_TO = 8
"""With K at most this, the text report shows pass@k for every k; above it, a line per power of two and K"""


def shown_k(samples: int) -> list[int]:
    """The k whose pass@k the text report shows, a line each: every k = 1..K when K <= 8 (K = 4 shows pass@1, 2, 3
    and 4); for larger K the powers of two below K, and K (K = 100: 1, 2, 4, ..., 64, 100), so a report of many
    samples stays a dozen lines. The JSON report and MLflow hold every k."""
    if samples <= SHOWN_ALL_UP_TO:
        return list(range(1, samples + 1))
    ks = [k for k in (2**i for i in range(samples.bit_length())) if k < samples]
    return [*ks, samples]


def _pass_line(result: EnvEvaluation, k: int, note: str) -> str:
    low, high = result.pass_at_interval[k]
    return f"  {f'pass@{k}':<16} {result.pass_at[k]:.3f}  [{low:.3f}, {high:.3f}]{note}"


def format_evaluation(result: EnvEvaluation) -> str:
    """The text block of one environment."""
    n, k = len(result.seeds), result.samples
    r = result.rates
    note = f" ({CONFIDENCE:.0%} interval, {BOOTSTRAP_RESAMPLES} bootstrap resamples of the {n} episodes)"
    passes = [_pass_line(result, j, note if i == 0 else "") for i, j in enumerate(shown_k(k))]
    episodes = f"{n} episodes" if k == 1 else f"{n} episodes x {k} samples ({n * k} played)"
    return "\n".join(
        [
            f"{result.env} ({result.config}): {episodes}, temperature {result.temperature:g}, "
            f"sampling seed {result.sampling_seed}",
            f"  success          {result.success:.3f}  [{result.success_low:.3f}, {result.success_high:.3f}] "
            f"({CONFIDENCE:.0%} interval, {result.effective_episodes:.1f} independent episodes)",
            *passes,
            f"  format ok        {r['format_ok_rate']:.3f} of turns   valid action {r['valid_turn_rate']:.3f} of turns",
            f"  turns            {r['num_turns']:.2f} per episode   actions {r['num_actions']:.2f}   "
            f"reward {r['reward']:.3f}",
            f"  tokens           {r['response_tokens']:.1f} sampled per turn   {r['sequence_tokens']:.1f} per episode",
        ]
    )
