"""Statistics for ablation tables: t-tests of an arm against the baseline, Holm's correction, power.

- ``compare``: the paired t-test on per-seed differences when both arms ran the same seeds (a seed fixes the
  prompts and the random draws, so pairing removes that noise from Δ), else Welch's unequal-variance t-test;
  either way Δ, its t interval, p and the minimum detectable effect at 80% power.
- ``holm``: Holm's step-down adjustment of the p-values of the arms of one table (Holm 1979).
- ``seeds_needed``: how many seeds detect a given Δ at 80% power, from a pilot study's spread.

A percentile bootstrap would be the other choice for intervals, but with the 2–5 seeds of a study it resamples
from a handful of values and gives intervals far too narrow; the t interval is honest about small n. Power uses
the noncentral t distribution (``nct_cdf``). Pure Python (``math``), so they need nothing beyond the standard
library; the tests compare them with hand-computed values and with ``scipy.stats``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    return _t_test(*_difference(a, b))


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Paired t-test of the differences a_i - b_i: ``(t, df, two-sided p)`` with t = d̄ / (s_d / sqrt(n)), df = n - 1.

    NaN for fewer than two pairs.
    """
    if len(a) < 2:
        return NAN, NAN, NAN
    return _t_test(*_paired_difference(a, b))


def _t_test(diff: float, se: float, df: float) -> tuple[float, float, float]:
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


def _paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(mean of a_i - b_i, its standard error s_d / sqrt(n), n - 1)."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    return mean(diffs), std(diffs) / math.sqrt(len(diffs)), len(diffs) - 1.0


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


def _interval(diff: float, se: float, df: float, level: float) -> tuple[float, float]:
    half = t_quantile(1 - level, df) * se if se else 0.0  # no spread at all: the interval is a point
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


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order; NaNs stay NaN and are not counted in m.

    The i-th smallest of m p-values becomes max over j <= i of min(1, (m - j + 1) · p_(j)) (Holm 1979; R's
    ``p.adjust(p, "holm")``). Rejecting where the adjusted p < α keeps the family-wise error rate at α.
    """
    ranked = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [NAN] * len(p_values), 0.0
    for rank, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - rank) * p))
        adjusted[i] = running
    return adjusted


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def nct_cdf(t: float, df: float, nc: float) -> float:
    """P(T <= t) for the noncentral t distribution with ``df`` degrees of freedom and noncentrality ``nc``.

    Lenth's series in incomplete beta functions (Applied Statistics algorithm AS 243, 1989), as R's ``pt`` with
    ``ncp``; for t < 0 through P(T <= t; nc) = 1 - P(T <= -t; -nc).
    """
    if t < 0:
        return 1.0 - nct_cdf(-t, df, -nc)
    x = t * t / (t * t + df)
    total = 0.0
    if x > 0:
        lam = nc * nc
        p = 0.5 * math.exp(-0.5 * lam)  # Poisson weights of the even and the odd terms
        q = math.sqrt(2 / math.pi) * p * nc
        remaining = -0.5 * math.expm1(-0.5 * lam)  # the Poisson mass not summed yet bounds the error
        a, b = 0.5, 0.5 * df
        rxb = (df / (t * t + df)) ** b
        log_beta = math.log(math.sqrt(math.pi)) + math.lgamma(b) - math.lgamma(0.5 + b)
        xodd = betainc(a, b, x)
        godd = 2 * rxb * math.exp(a * math.log(x) - log_beta)
        xeven = 1 - rxb if b * x >= 1e-16 else b * x
        geven = b * x * rxb
        total = p * xodd + q * xeven
        for k in range(1, 2000):
            a += 1
            xodd, xeven = xodd - godd, xeven - geven
            godd *= x * (a + b - 1) / a
            geven *= x * (a + b - 0.5) / (a + 0.5)
            p *= lam / (2 * k)
            q *= lam / (2 * k + 1)
            total += p * xodd + q * xeven
            remaining -= p
            if (remaining <= 0 and k > 1) or abs(2 * remaining * (xodd - godd)) < 1e-13:
                break
    return min(1.0, total + normal_cdf(-nc))


ALPHA, POWER = 0.05, 0.8  # two-sided level and power of the tables' detectable effects and seed counts


def power(nc: float, df: float, *, alpha: float = ALPHA, critical: float | None = None) -> float:
    """Power of a two-sided t-test at level ``alpha`` when the true effect is ``nc`` standard errors.

    ``critical``: the test's t_{df}(alpha), when the caller asks for many ``nc`` at one ``df``.
    """
    critical = t_quantile(alpha, df) if critical is None else critical
    return 1.0 - nct_cdf(critical, df, nc) + nct_cdf(-critical, df, nc)


def detectable(se: float, df: float, *, alpha: float = ALPHA, target: float = POWER) -> float:
    """Minimum detectable effect: the |Δ| a two-sided t-test with this ``se`` and ``df`` finds with power ``target``.

    The noncentrality nc with power(nc, df) = target (bisection; power rises with nc), times ``se``.
    """
    if math.isnan(se) or math.isnan(df) or df <= 0:
        return NAN
    critical = t_quantile(alpha, df)
    low, high = 0.0, 1.0
    while power(high, df, critical=critical) < target:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if power(mid, df, critical=critical) < target else (low, mid)
    return high * se


def seeds_needed(delta: float, variances: tuple[float, ...], *, alpha: float = ALPHA, target: float = POWER,
                 most: int = 100_000) -> int | None:  # fmt: skip
    """The fewest seeds n >= 2 with which a t-test finds |Δ| = ``delta`` with power ``target``; None past ``most``.

    ``variances``: one, the variance of a per-seed difference (paired: se = sqrt(v / n), df = n - 1); or two, the
    arms' variances, each arm run with n seeds (Welch: se = sqrt((v_a + v_b) / n), Welch–Satterthwaite df).
    """
    if delta == 0 or any(math.isnan(v) for v in variances):
        return None
    if sum(variances) == 0:
        return 2

    def enough(n: int) -> bool:
        se, df = math.sqrt(sum(variances) / n), n - 1.0
        if len(variances) == 2:
            df = (n - 1) * sum(variances) ** 2 / sum(v * v for v in variances)
        return power(abs(delta) / se, df, alpha=alpha) >= target

    low, high = 1, 2  # enough(high) and not enough(low): double, then bisect
    while not enough(high):
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


@dataclass(frozen=True)
class Comparison:
    """One arm against the baseline. ``sigma``: the standard deviation of a one-seed difference (paired: of the
    per-seed differences; Welch: sqrt(s_arm² + s_base²)), which sets the seeds a given Δ needs."""

    test: str  # "paired" | "Welch" | "" (fewer than two seeds on a side)
    delta: float
    low: float
    high: float
    p: float
    detectable: float
    variances: tuple[float, ...]  # as ``seeds_needed`` takes them: (of a per-seed difference,) | (arm's, base's)

    @property
    def sigma(self) -> float:
        return math.sqrt(sum(self.variances)) if self.variances else NAN


def compare(arm: Mapping[str, float], base: Mapping[str, float], *, level: float = 0.95) -> Comparison:
    """``arm`` and ``base`` map seed -> value. Paired when both ran the same seeds (two or more), else Welch."""
    if arm.keys() == base.keys() and len(arm) >= 2:
        seeds = sorted(arm)
        diff, se, df = _paired_difference([arm[s] for s in seeds], [base[s] for s in seeds])
        test, variances = "paired", ((se * se) * len(seeds),)
    elif len(arm) >= 2 and len(base) >= 2:
        a, b = list(arm.values()), list(base.values())
        diff, se, df = _difference(a, b)
        test, variances = "Welch", (std(a) ** 2, std(b) ** 2)
    else:
        return Comparison("", mean(list(arm.values())) - mean(list(base.values())), NAN, NAN, NAN, NAN, ())
    low, high = _interval(diff, se, df, level)
    return Comparison(test, diff, low, high, _t_test(diff, se, df)[2], detectable(se, df) if se else 0.0, variances)
