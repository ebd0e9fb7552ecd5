"""What `evaluate` estimates from K samples of each of N episodes: pass@k, its interval, and the success rate's.

`successes[i]` is c_i, how many of item i's K samples succeeded (an item is one episode seed: one map, one
question). The samples of one item share its difficulty, so they are not K independent draws: the success interval
counts them as fewer, and the pass@k interval resamples whole items (episodes), never single samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ragen_lit.analysis.stats import wilson_interval


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c succeeded (Chen et al. 2021, Eq. 1):
    1 - C(n - c, k) / C(n, k), the chance that k of the n samples drawn without replacement hold a success.
    Computed as 1 - prod_{j=n-c+1}^{n} (1 - k/j), which needs no large binomials. Needs 1 <= k <= n, 0 <= c <= n."""
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k holds a success
        return 1.0
    return 1.0 - math.prod(1.0 - k / j for j in range(n - c + 1, n + 1))


def mean_pass_at_k(successes: Sequence[int], samples: int, k: int) -> float:
    """pass@k of a set of items: the mean over items of `pass_at_k(samples, c_i, k)`."""
    return sum(pass_at_k(samples, c, k) for c in successes) / len(successes)


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
"""The pass@k interval's resamples and generator seed: fixed, so one report's intervals are reproducible"""


def bootstrap_pass_at_k(
    successes: Sequence[int],
    samples: int,
    ks: Sequence[int],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> np.ndarray:
    """Mean pass@k of `resamples` bootstrap resamples of the items, shape (resamples, len(ks)).

    A resample draws N items of the N with replacement and averages `pass_at_k(samples, c_i, k)` over them. The unit
    is the item, not the sample: the K samples of one episode share its map or question, so they are correlated, and
    resampling them one by one would treat them as independent and give too narrow an interval. Items with equal c_i
    have equal pass@k, so a resample is drawn as how many times it takes each success count c = 0..K (a multinomial
    with the counts' shares as probabilities), the same distribution as drawing the N indices, in memory that does not
    grow with N; the draws depend on the multiset of c_i alone, not on the items' order."""
    n_items = len(successes)
    if n_items == 0 or not all(0 <= c <= samples for c in successes):
        raise ValueError(f"the pass@k bootstrap needs items with 0..{samples} successes, got {list(successes)}")
    per_count = np.array([[pass_at_k(samples, c, k) for k in ks] for c in range(samples + 1)])  # (K + 1, len(ks))
    shares = np.bincount(np.asarray(successes, dtype=np.int64), minlength=samples + 1) / n_items
    draws = np.random.default_rng(seed).multinomial(n_items, shares, size=resamples)  # (resamples, K + 1)
    return draws @ per_count / n_items


def pass_at_k_intervals(
    successes: Sequence[int],
    samples: int,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[int, tuple[float, float]]:
    """The percentile bootstrap interval of mean pass@k for k = 1..K: the (1 - confidence)/2 and (1 + confidence)/2
    quantiles of `bootstrap_pass_at_k`. An interval collapses to the point when every item has the same pass@k
    (all succeed, all fail), and is [point, point] with one item."""
    ks = list(range(1, samples + 1))
    means = bootstrap_pass_at_k(successes, samples, ks, resamples, seed)
    lows, highs = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)
    return {k: (float(low), float(high)) for k, low, high in zip(ks, lows, highs)}


def effective_episodes(successes: Sequence[int], samples: int) -> float:
    """How many independent episodes N items x K samples are worth for the success rate (Kish's design effect).

    The rate p = sum c_i / NK; with item rates p_i = c_i / K its variance across items is
    Var = sum (p_i - p)² / (N (N - 1)) (the items are the independent units), and the worth is p (1 - p) / Var:
    N K when the items are alike (the samples act independent), N when each item always succeeds or always fails
    (its K samples repeat one outcome). The result is clamped to [N, NK]: equal cluster sizes give a design effect
    between 1 and K unless samples of one item are negatively correlated, where NK is the cautious bound. With
    p = 0 or 1 there is no variance to read the correlation from, and N is used."""
    n_items = len(successes)
    total = n_items * samples
    if samples == 1 or n_items < 2:
        return float(total)
    p = sum(successes) / total
    if p in (0.0, 1.0):
        return float(n_items)
    rates = [c / samples for c in successes]
    variance = sum((r - p) ** 2 for r in rates) / (n_items * (n_items - 1))
    if variance == 0.0:
        return float(total)
    return min(max(p * (1 - p) / variance, float(n_items)), float(total))


def success_interval(successes: Sequence[int], samples: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's interval of the success rate sum c_i / NK at `effective_episodes` trials: with one sample per item
    exactly Wilson's interval over the N episodes; with K samples per item no narrower than the items allow."""
    n_eff = effective_episodes(successes, samples)
    p = sum(successes) / (len(successes) * samples)
    return wilson_interval(p * n_eff, n_eff, confidence)
