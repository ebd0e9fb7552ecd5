"""What `evaluate` estimates from K samples of each of N episodes: pass@k and the success rate's interval.

`successes[i]` is c_i, how many of item i's K samples succeeded (an item is one episode seed: one map, one
question). The samples of one item share its difficulty, so they are not K independent draws: the interval below
counts them as fewer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
