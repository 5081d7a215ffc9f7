"""Means and 95% intervals over a handful of seeds (torch-free, no scipy).

A study runs each variant with a few seeds, so its intervals use Student's t distribution:
for n values with mean m and sample standard deviation s, the 95% interval of the mean is
m ± t(0.975, n-1) · s / √n. With one value there is no spread to measure and the interval
is the point itself, flagged by `n == 1`. Two variants are compared either unpaired
(`difference_interval`, Welch) or, where their runs pair up (the same seed of each),
paired (`paired_interval`: the one-sample interval of the pairs' differences). The t
quantile is computed here (the regularized incomplete beta function by its continued
fraction, then bisection) rather than taken from scipy, which blockviz does not
otherwise need.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """The mean of some finite values with its spread and 95% t interval."""

    n: int  # finite values counted
    mean: float
    sd: float  # sample standard deviation (n - 1); 0.0 when n < 2
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, not {df}")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value with P(T <= t) = p (bisection on `t_cdf`; p in (0, 1))."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), not {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return (low + high) / 2.0


def finite(values: Iterable[float | int | None]) -> list[float]:
    """The finite numbers among `values` (None, NaN and infinities dropped)."""
    out = []
    for value in values:
        if value is None:
            continue
        number = float(value)
        if math.isfinite(number):
            out.append(number)
    return out


def mean_interval(values: Iterable[float | int | None]) -> Interval | None:
    """Mean, sd and 95% t interval of the finite values; None when there are none."""
    xs = finite(values)
    n = len(xs)
    if n == 0:
        return None
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(1, mean, 0.0, mean, mean)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half)


def difference_interval(
    a: Iterable[float | int | None], b: Iterable[float | int | None]
) -> Interval | None:
    """95% Welch interval of mean(a) - mean(b); None unless both have two finite values.

    Welch's form does not assume the two variants have the same spread; its degrees of
    freedom come from the Welch-Satterthwaite equation. `sd` holds the standard error.
    """
    xa, xb = finite(a), finite(b)
    if len(xa) < 2 or len(xb) < 2:
        return None
    ia, ib = mean_interval(xa), mean_interval(xb)
    assert ia is not None and ib is not None
    va, vb = ia.sd**2 / ia.n, ib.sd**2 / ib.n
    diff = ia.mean - ib.mean
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Interval(ia.n + ib.n, diff, 0.0, diff, diff)
    df = (va + vb) ** 2 / (va**2 / (ia.n - 1) + vb**2 / (ib.n - 1))
    half = t_quantile(0.5 + CONFIDENCE / 2, df) * se
    return Interval(ia.n + ib.n, diff, se, diff - half, diff + half)


def paired_interval(
    a: Sequence[float | int | None], b: Sequence[float | int | None]
) -> Interval | None:
    """95% t interval of the mean of a[i] - b[i] over the pairs finite on both sides; None
    unless two such pairs exist. `n` counts those pairs.

    Noise the two members of a pair share (here: a seed's data order and initial weights)
    cancels in their difference, so this interval is narrower than Welch's whenever that
    shared noise is a large part of the spread.
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} values paired with {len(b)}")
    differences = [
        float(x) - float(y)
        for x, y in zip(a, b, strict=True)
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
    ]
    if len(differences) < 2:
        return None
    return mean_interval(differences)
