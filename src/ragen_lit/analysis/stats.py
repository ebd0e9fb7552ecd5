"""Summary statistics over seeds, as pure functions of lists of floats.

NaN entries (a run that did not log the metric) are dropped first, so `n` counts the runs that have a value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True)
class Summary:
    """mean, sample std (ddof=1; NaN when n < 2) and n of the finite values."""

    mean: float
    std: float
    n: int


@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) with its Welch interval [low, high] at `confidence`; df = Welch–Satterthwaite."""

    delta: float
    low: float
    high: float
    df: float
    confidence: float


def finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if not math.isnan(v)]


def mean(values: Sequence[float]) -> float:
    """x̄ = Σx / n; NaN when there is no value."""
    xs = finite(values)
    return sum(xs) / len(xs) if xs else math.nan


def std(values: Sequence[float]) -> float:
    """Sample standard deviation s = sqrt(Σ(x - x̄)² / (n - 1)); NaN when n < 2 (one seed has no spread)."""
    xs = finite(values)
    if len(xs) < 2:
        return math.nan
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def summarize(values: Sequence[float]) -> Summary:
    return Summary(mean(values), std(values), len(finite(values)))


def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Difference:
    """Difference of means d = x̄a - x̄b with Welch's interval d ± t_{(1+c)/2, ν} · se, where

        se = sqrt(sa²/na + sb²/nb),
        ν  = se⁴ / ((sa²/na)² / (na - 1) + (sb²/nb)² / (nb - 1))   (Welch–Satterthwaite).

    Welch rather than Student because seeds of two grid points need not share a variance. With n < 2 on
    either side there is no variance estimate, so the interval (and ν) is NaN. When both sides have zero
    spread (se = 0) the interval collapses to [d, d] and ν is reported as inf.
    """
    sa, sb = summarize(a), summarize(b)
    delta = sa.mean - sb.mean
    if sa.n < 2 or sb.n < 2:
        return Difference(delta, math.nan, math.nan, math.nan, confidence)
    va, vb = sa.std**2 / sa.n, sb.std**2 / sb.n
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(delta, delta, delta, math.inf, confidence)
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    from scipy.stats import t as student_t  # Student's t quantile: not in the standard library

    half = float(student_t.ppf((1 + confidence) / 2, df)) * se
    return Difference(delta, delta - half, delta + half, df, confidence)


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion k/n: the p with |k/n - p| <= z·sqrt(p(1 - p)/n), z the normal
    quantile at (1 + c)/2; solved, (p̂ + z²/2n ± z·sqrt(p̂(1 - p̂)/n + z²/4n²)) / (1 + z²/n). Unlike the normal
    approximation it stays inside [0, 1] and is not empty at k = 0 or k = n. NaN for n = 0."""
    if n == 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at k = 0 (k = n) the lower (upper) bound is 0 (1) exactly, which the rounded formula misses by an ulp
    low = 0.0 if k == 0 else (centre - half) / (1 + z * z / n)
    high = 1.0 if k == n else (centre + half) / (1 + z * z / n)
    return low, high


def proportion_difference(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> Difference:
    """Difference of proportions d = k1/n1 - k2/n2 with Newcombe's hybrid score interval (his method 10), built from
    each side's Wilson interval [l, u]: [d - sqrt((p1 - l1)² + (u2 - p2)²), d + sqrt((u1 - p1)² + (p2 - l2)²)].
    Rates over a handful of seeds (a collapse rate of 7 of 16 runs) are where the Wald interval fails; df is NaN
    (there is none)."""
    if n1 == 0 or n2 == 0:
        return Difference(math.nan, math.nan, math.nan, math.nan, confidence)
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, confidence)
    l2, u2 = wilson_interval(k2, n2, confidence)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return Difference(d, low, high, math.nan, confidence)


def fisher_exact_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p of Fisher's exact test that k1 of n1 and k2 of n2 come from one proportion: the probability,
    under the hypergeometric law of the 2x2 table with its margins fixed, of a table no more likely than the one
    observed. NaN when either side has no run."""
    if n1 == 0 or n2 == 0:
        return math.nan
    from scipy.stats import fisher_exact

    return float(fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue)
