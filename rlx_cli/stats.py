"""Statistics for ablation tables: Welch's t-test and its confidence interval of a difference in means.

A percentile bootstrap would be the other choice, but with the 2–5 seeds of a study it resamples from a handful
of values and gives intervals far too narrow; the t interval is honest about small n. Pure Python (``math``), so
they need nothing beyond the standard library; the tests compare them with hand-computed values and, where it
is installed, with ``scipy.stats``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NAN = float("nan")


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else NAN


def std(xs: Sequence[float]) -> float:
    """Sample standard deviation (ddof = 1); NaN for fewer than two values."""
    if len(xs) < 2:
        return NAN
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Welch's unequal-variance t-test of mean(a) - mean(b): ``(t, df, two-sided p)``.

    t = (ā - b̄) / sqrt(s_a²/n_a + s_b²/n_b); df by Welch–Satterthwaite (Welch 1947). NaN if a side has n < 2.
    """
    if len(a) < 2 or len(b) < 2:
        return NAN, NAN, NAN
    diff, se, df = _difference(a, b)
    if se == 0:  # no spread at all: the means are equal or certainly not
        return (0.0 if diff == 0 else math.copysign(math.inf, diff)), NAN, (1.0 if diff == 0 else 0.0)
    t = diff / se
    return t, df, t_two_sided_p(t, df)


def _difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(mean(a) - mean(b), its standard error sqrt(s_a²/n_a + s_b²/n_b), Welch–Satterthwaite df; NaN df if se = 0)."""
    va, vb = std(a) ** 2 / len(a), std(b) ** 2 / len(b)
    if va + vb == 0:
        return mean(a) - mean(b), 0.0, NAN
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return mean(a) - mean(b), math.sqrt(va + vb), df


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2)."""
    return betainc(df / 2, 0.5, df / (df + t * t))


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) by its continued fraction (Numerical Recipes, 3rd ed., §6.4)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1 - x) / b


def _beta_fraction(a: float, b: float, x: float, *, eps: float = 1e-15, tiny: float = 1e-300) -> float:
    """Modified Lentz evaluation of the continued fraction for I_x(a, b)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def welch_ci(a: Sequence[float], b: Sequence[float], *, level: float = 0.95) -> tuple[float, float]:
    """Welch's confidence interval of mean(a) - mean(b): Δ ± t_{df}(level) · sqrt(s_a²/n_a + s_b²/n_b); NaN if n < 2."""
    if len(a) < 2 or len(b) < 2:
        return NAN, NAN
    diff, se, df = _difference(a, b)
    half = t_quantile(1 - level, df) * se if se else 0.0  # no spread on either side: a point
    return diff - half, diff + half


def t_quantile(p_two_sided: float, df: float) -> float:
    """The t > 0 with P(|T| >= t) = ``p_two_sided`` for ``df`` degrees of freedom (bisection on ``t_two_sided_p``)."""
    low, high = 0.0, 1.0
    while t_two_sided_p(high, df) > p_two_sided:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided_p(mid, df) > p_two_sided else (low, mid)
    return (low + high) / 2
