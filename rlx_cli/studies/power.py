"""Power and seed counts: how likely a study of n seeds decides, and how many seeds it takes.

A comparison's noise is given as ``variances``, as ``comparison.Comparison`` holds them: (v,) the variance of a
per-seed difference (paired: SE = √(v/n), df = n − 1) or (v_arm, v_base) with each arm run with n seeds (Welch:
SE = √((v_arm + v_base)/n), Welch–Satterthwaite df). Powers use the noncentral t (scipy's ``nctdtr``):

- ``power``: a two-sided t-test at ``level`` finds a true Δ;
- ``power_equivalent``: TOST at ``level`` (each one-sided test at ``level``) declares |Δ| < δ, the lower bound
  P(T₁ > c) + P(T₂ < −c) − 1 of the joint event (exact as the power nears 1, below it elsewhere: a plan from it errs
  on the side of more seeds);
- ``seeds_to_decide``: the seeds a fresh study needs to decide an arm with 80% power: ``better``/``worse`` by the
  t-test or ``equivalent`` by TOST, whichever is likelier at the pilot's Δ, at the level its row was judged at.

A pilot's σ is itself noisy, and a plan from σ̂ as if it were σ falls short of its power (from 2–3 seeds, 62–71% for
a promised 80%). Plans take the ``UPPER`` upper confidence bound of the variance, σ̂² · df / χ²_{1−UPPER, df}
(Browne 1995), which shrinks towards σ̂² as the pilot grows: in a 5-arm table from 5-seed pilots the printed seeds
then decide 83–100% of arms at Δ = 0 and at Δ = 2δ with σ = δ or 2δ (``tests/test_stats.py``; 65–96% from σ̂).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy import optimize, special

NAN = float("nan")
POWER = 0.8
UPPER = 0.7  # the confidence of the upper bound of a pilot's variance that plans take
MOST = 100_000


def se_df(variances: tuple[float, ...], n: int) -> tuple[float, float]:
    """The SE of Δ and its df with ``n`` seeds an arm."""
    total = sum(variances)
    if len(variances) == 1:
        return math.sqrt(total / n), n - 1.0
    return math.sqrt(total / n), (n - 1) * total**2 / sum(v * v for v in variances)


def nct_cdf(t: float, df: float, nc: float) -> float:
    """P(T <= t) for the noncentral t with ``df`` degrees of freedom and noncentrality ``nc`` (NaN far out -> 0)."""
    found = float(special.nctdtr(df, nc, t))
    return 0.0 if math.isnan(found) else found


def t_critical(one_sided: float, df: float) -> float:
    """The t > 0 with P(T >= t) = ``one_sided``."""
    return float(-special.stdtrit(df, one_sided))


def power_of(delta: float, se: float, df: float, level: float) -> float:
    """Power of a two-sided t-test at ``level`` when the true effect is ``delta`` and Δ's SE is ``se``."""
    critical, nc = t_critical(level / 2, df), delta / se
    return 1.0 - nct_cdf(critical, df, nc) + nct_cdf(-critical, df, nc)


def power(delta: float, variances: tuple[float, ...], n: int, level: float) -> float:
    return power_of(delta, *se_df(variances, n), level)


def power_equivalent(delta: float, variances: tuple[float, ...], n: int, margin: float, level: float) -> float:
    """A lower bound of TOST's power at ``level`` against ±``margin`` when the true effect is ``delta``."""
    se, df = se_df(variances, n)
    critical = t_critical(level, df)
    above_low = 1.0 - nct_cdf(critical, df, (delta + margin) / se)  # P(T₁ > c): Δ <= -δ rejected
    below_high = nct_cdf(-critical, df, (delta - margin) / se)  # P(T₂ < -c): Δ >= +δ rejected
    return max(0.0, above_low + below_high - 1.0)


def detectable(se: float, df: float, *, level: float, target: float = POWER) -> float:
    """Minimum detectable effect: the |Δ| a two-sided t-test at ``level`` with this ``se`` and ``df`` finds with
    power ``target`` (Brent's root of the power in the noncentrality, times ``se``); NaN without a spread."""
    if math.isnan(se) or math.isnan(df) or df <= 0 or se == 0:
        return NAN
    short = lambda nc: power_of(nc, 1.0, df, level) - target  # noqa: E731
    high = 1.0
    while short(high) < 0:
        high *= 2
    return optimize.brentq(short, 0.0, high, xtol=1e-13) * se


def fewest(enough: Callable[[int], bool], start: int, most: int = MOST) -> int | None:
    """The fewest n >= ``start`` with ``enough(n)`` (which holds from some n on); None past ``most``."""
    low, high = start - 1, start  # enough(high) and not enough(low): double, then bisect
    while not enough(high):
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def seeds_needed(delta: float, variances: tuple[float, ...], *, alpha: float, target: float = POWER,
                 most: int = MOST) -> int | None:  # fmt: skip
    """The fewest seeds n >= 2 with which a two-sided t-test at ``alpha`` finds |Δ| = ``delta`` with power
    ``target``; None past ``most`` or without a spread to plan from."""
    if delta == 0 or not variances or any(math.isnan(v) for v in variances) or sum(variances) == 0:
        return None
    return fewest(lambda n: power(abs(delta), variances, n, alpha) >= target, 2, most)


def planned_variances(variances: tuple[float, ...], df: float) -> tuple[float, ...]:
    """The variances a plan uses: the ``UPPER`` upper confidence bound of the pilot's, σ̂² · df / χ²_{1-UPPER, df}
    (``df``: the pilot's degrees of freedom)."""
    factor = df / float(special.chdtri(df, UPPER))  # chdtri(df, q): the x with P(χ² > x) = q
    return tuple(v * factor for v in variances)


def seeds_for(delta: float, variances: tuple[float, ...], *, margin: float, level: float, start: int = 2,
              target: float = POWER, most: int = MOST) -> int | None:  # fmt: skip
    """The fewest seeds per arm, from ``start`` on, with which a study decides an arm whose true effect is ``delta``
    with power ``target`` at ``level``: the t-test finds it, or TOST shows |Δ| < ``margin``. None past ``most`` or
    without a spread to plan from."""
    if not variances or any(math.isnan(v) for v in variances) or sum(variances) == 0:
        return None

    def decides(n: int) -> bool:
        if power(delta, variances, n, level) >= target:
            return True
        return abs(delta) < margin and power_equivalent(delta, variances, n, margin, level) >= target

    return fewest(decides, max(2, start), most)


def seeds_to_decide(delta: float, variances: tuple[float, ...], pilot: int, df: float, *, margin: float, level: float,
                    target: float = POWER, most: int = MOST) -> int | None:  # fmt: skip
    """``seeds_for`` a fresh study, planned from a pilot of ``pilot`` seeds (``df`` the degrees of freedom of its
    ``variances``): from their upper confidence bound, and more than ``pilot``."""
    if not variances or any(math.isnan(v) for v in variances):
        return None
    planned = planned_variances(variances, df)
    return seeds_for(delta, planned, margin=margin, level=level, start=pilot + 1, target=target, most=most)
