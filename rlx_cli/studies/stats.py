"""Statistics for ablation tables: t-tests of an arm against the baseline, Holm's correction, power, verdicts.

- ``compare``: the paired t-test on per-seed differences when both arms ran the same seeds (a seed fixes the
  prompts and the random draws, so pairing removes that noise from Δ), else Welch's unequal-variance t-test;
  either way Δ, its t interval, p and the minimum detectable effect at 80% power.
- ``verdict``: one comparison's label: ``better`` / ``worse`` (the t-test's p below α), ``equivalent`` (two one-sided
  tests against a margin δ, TOST, both below α), else ``inconclusive`` with the seeds that would decide it.
- ``holm``: Holm's step-down adjustment of the p-values of the arms of one table (Holm 1979).
- ``seeds_needed``: how many seeds detect a given Δ at 80% power, from a pilot study's spread.

A percentile bootstrap would be the other choice for intervals, but with the 2–5 seeds of a study it resamples
from a handful of values and gives intervals far too narrow; the t interval is honest about small n. The tests are
``scipy.stats``' ``ttest_rel`` and ``ttest_ind(equal_var=False)``; intervals, TOST and power use the functions behind
its ``t`` and ``nct`` (noncentral t) distributions, ``scipy.special``'s ``stdtr``, ``stdtrit`` and ``nctdtr``, called
directly: a verdict's seed count evaluates the power a few dozen times, 20 times faster without the wrappers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import optimize, special
from scipy import stats as tests

NAN = float("nan")
ALPHA, POWER = 0.05, 0.8  # two-sided level and power of the tables' detectable effects and seed counts
LABELS = ("better", "worse", "equivalent", "inconclusive")


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
    if se == 0:
        return _no_spread(diff)
    result = tests.ttest_ind(a, b, equal_var=False)
    return float(result.statistic), df, float(result.pvalue)


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Paired t-test of the differences a_i - b_i: ``(t, df, two-sided p)`` with t = d̄ / (s_d / sqrt(n)), df = n - 1.

    NaN for fewer than two pairs.
    """
    if len(a) < 2:
        return NAN, NAN, NAN
    diff, se, df = _paired_difference(a, b)
    if se == 0:
        return _no_spread(diff)
    result = tests.ttest_rel(a, b)
    return float(result.statistic), df, float(result.pvalue)


def _no_spread(diff: float) -> tuple[float, float, float]:
    """No spread at all: the means are equal (p = 1) or certainly not (p = 0)."""
    return (0.0 if diff == 0 else math.copysign(math.inf, diff)), NAN, (1.0 if diff == 0 else 0.0)


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


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (``scipy.special.betainc``)."""
    return float(special.betainc(a, b, min(max(x, 0.0), 1.0)))


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    return float(2 * special.stdtr(df, -abs(t)))


def t_quantile(p_two_sided: float, df: float) -> float:
    """The t > 0 with P(|T| >= t) = ``p_two_sided`` for ``df`` degrees of freedom."""
    return float(-special.stdtrit(df, p_two_sided / 2))


def nct_cdf(t: float, df: float, nc: float) -> float:
    """P(T <= t) for the noncentral t distribution with ``df`` degrees of freedom and noncentrality ``nc``."""
    return float(special.nctdtr(df, nc, t))


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


def power(nc: float, df: float, *, alpha: float = ALPHA, critical: float | None = None) -> float:
    """Power of a two-sided t-test at level ``alpha`` when the true effect is ``nc`` standard errors.

    ``critical``: the test's t_{df}(alpha), when the caller asks for many ``nc`` at one ``df``. The far lower tail
    is 0 where an older scipy returns NaN for it.
    """
    critical = t_quantile(alpha, df) if critical is None else critical
    lower = nct_cdf(-critical, df, nc)
    return 1.0 - nct_cdf(critical, df, nc) + (0.0 if math.isnan(lower) else lower)


def detectable(se: float, df: float, *, alpha: float = ALPHA, target: float = POWER) -> float:
    """Minimum detectable effect: the |Δ| a two-sided t-test with this ``se`` and ``df`` finds with power ``target``.

    The noncentrality nc with power(nc, df) = target (Brent's root; power rises with nc), times ``se``.
    """
    if math.isnan(se) or math.isnan(df) or df <= 0:
        return NAN
    critical = t_quantile(alpha, df)
    short = lambda nc: power(nc, df, critical=critical) - target  # noqa: E731
    high = 1.0
    while short(high) < 0:
        high *= 2
    return optimize.brentq(short, 0.0, high, xtol=1e-13) * se


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
    se: float = NAN  # the standard error of Δ
    df: float = NAN  # its degrees of freedom (NaN when se = 0)

    @property
    def sigma(self) -> float:
        return math.sqrt(sum(self.variances)) if self.variances else NAN


def compare(arm: Mapping[str, float], base: Mapping[str, float], *, level: float = 0.95) -> Comparison:
    """``arm`` and ``base`` map seed -> value. Paired when both ran the same seeds (two or more), else Welch.

    ``level``: of the interval; the detectable effect is at α = 1 - ``level``."""
    if arm.keys() == base.keys() and len(arm) >= 2:
        seeds = sorted(arm)
        a, b = [arm[s] for s in seeds], [base[s] for s in seeds]
        (diff, se, df), p = _paired_difference(a, b), paired(a, b)[2]
        test, variances = "paired", ((se * se) * len(seeds),)
    elif len(arm) >= 2 and len(base) >= 2:
        a, b = list(arm.values()), list(base.values())
        (diff, se, df), p = _difference(a, b), welch(a, b)[2]
        test, variances = "Welch", (std(a) ** 2, std(b) ** 2)
    else:
        return Comparison("", mean(list(arm.values())) - mean(list(base.values())), NAN, NAN, NAN, NAN, ())
    half = t_quantile(1 - level, df) * se if se else 0.0  # no spread at all: the interval is a point
    mde = detectable(se, df, alpha=1 - level) if se else 0.0
    return Comparison(test, diff, diff - half, diff + half, p, mde, variances, se, df)


def equivalence_p(comparison: Comparison, margin: float) -> float:
    """TOST (Schuirmann 1987): the larger p of the two one-sided tests of H0 Δ <= -margin and H0 Δ >= +margin; below
    α both reject and |Δ| < margin at level α. NaN without a test."""
    delta, se, df = comparison.delta, comparison.se, comparison.df
    if not comparison.test:
        return NAN
    if se == 0:
        return 0.0 if abs(delta) < margin else 1.0
    above_low = float(special.stdtr(df, -(delta + margin) / se))  # H0: Δ <= -margin
    below_high = float(special.stdtr(df, (delta - margin) / se))  # H0: Δ >= +margin
    return max(above_low, below_high)


def label(delta: float, p: float, p_equivalent: float, *, alpha: float = ALPHA, lower_is_better: bool = False) -> str:
    """``better`` / ``worse`` where p < α (by the sign of Δ, flipped when lower is better), else ``equivalent`` where
    TOST's p < α, else ``inconclusive`` (also without a test: NaN p-values)."""
    if p < alpha:
        return "better" if (delta > 0) != lower_is_better else "worse"
    return "equivalent" if p_equivalent < alpha else "inconclusive"


@dataclass(frozen=True)
class Verdict:
    """One arm against the baseline: its ``label`` (one of ``LABELS``), Δ = mean(a) - mean(b), the 1 - α interval of
    Δ, the t-test's two-sided p, TOST's ``p_equivalent`` and, when inconclusive, the seeds that would decide it."""

    label: str
    delta: float
    low: float
    high: float
    p: float
    p_equivalent: float
    seeds_needed: int | None


def deciding_seeds(comparison: Comparison, margin: float, *, alpha: float = ALPHA) -> int | None:
    """The seeds per arm with which the t-test finds max(|Δ|, margin) at 80% power (δ when Δ is near 0: then the
    question is whether the arms are equivalent, which a test that finds δ settles); None without a test."""
    if not comparison.test:
        return None
    return seeds_needed(max(abs(comparison.delta), margin), comparison.variances, alpha=alpha)


def verdict(a: Sequence[float], b: Sequence[float], *, margin: float, alpha: float = ALPHA, paired: bool = True,
            lower_is_better: bool = False) -> Verdict:  # fmt: skip
    """The verdict on an arm's per-seed values ``a`` against the baseline's ``b`` (in seed order) at level ``alpha``,
    ``margin`` δ in the metric's units: the paired t-test (``paired``; a and b equally long) or Welch's, TOST against
    ±δ, ``label``. One comparison; a table of arms adjusts p and p_equivalent with ``holm`` before it labels them."""
    if paired and len(a) != len(b):
        raise ValueError(f"paired verdict of {len(a)} against {len(b)} values (valid: as many, in seed order)")
    arm = {str(i): x for i, x in enumerate(a)} if paired else {f"a{i}": x for i, x in enumerate(a)}
    base = {str(i): x for i, x in enumerate(b)} if paired else {f"b{i}": x for i, x in enumerate(b)}
    comparison = compare(arm, base, level=1 - alpha)
    p_equivalent = equivalence_p(comparison, margin)
    called = label(comparison.delta, comparison.p, p_equivalent, alpha=alpha, lower_is_better=lower_is_better)
    needed = deciding_seeds(comparison, margin, alpha=alpha) if called == "inconclusive" else None
    return Verdict(called, comparison.delta, comparison.low, comparison.high, comparison.p, p_equivalent, needed)
