"""One arm against the baseline: the paired t-test on per-seed differences when both ran the same seeds, else Welch's.

A seed fixes the prompts and the random draws, so pairing removes that noise from Δ. Everything a verdict reads comes
from scipy's own tests (``ttest_1samp`` on the differences, ``ttest_ind(equal_var=False)``): the two-sided p of
Δ = 0, TOST's p against a margin δ (the larger p of the one-sided tests of Δ <= -δ and Δ >= +δ, Schuirmann 1987),
the degrees of freedom and the t interval at any confidence. ``compare_rows`` runs them over many comparisons at once
(rows of an array), as a simulation needs; ``compare`` is one row of it. A spread below float rounding of the values
(``TIE``) is no spread: a t statistic over it would claim certainty (Δ / 0), so such a comparison has no p; Δ = 0
with no spread is ``identical``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as tests

NAN = float("nan")
TIE = 1e-9  # a spread or a Δ below this share of the values' size is float rounding (0.3 - 0.2 = 0.09999999999999998)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if len(xs) else NAN


def std(xs: Sequence[float]) -> float:
    """Sample standard deviation (ddof = 1); NaN for fewer than two values."""
    if len(xs) < 2:
        return NAN
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@dataclass(frozen=True)
class Comparison:
    """An arm's values against the baseline's: ``paired`` or ``Welch``, "" when a side has fewer than two values.
    ``variances`` as ``power`` takes them: (of a per-seed difference,) paired or (the arm's, the baseline's) Welch;
    ``p`` and ``p_equivalent`` (TOST against ±``margin``) NaN without a test or with no spread (``tied``)."""

    test: str
    delta: float
    se: float
    df: float
    variances: tuple[float, ...]
    n: int  # seeds on the smaller side
    tied: bool
    p: float
    p_equivalent: float
    margin: float
    arm: tuple[float, ...]
    base: tuple[float, ...]

    @property
    def sigma(self) -> float:
        """The standard deviation of a one-seed Δ: what a seed adds to Δ's noise."""
        return math.sqrt(sum(self.variances)) if self.variances else NAN

    @property
    def identical(self) -> bool:
        """No spread and Δ = 0 (up to float rounding): the arms computed the same numbers on every seed."""
        return self.tied and abs(self.delta) <= TIE * scale_of(self.arm, self.base)

    @property
    def testable(self) -> bool:
        return bool(self.test) and not self.tied

    def interval(self, confidence: float) -> tuple[float, float]:
        """The two-sided t interval of Δ at ``confidence`` (scipy's); NaN without a test or with no spread."""
        if not self.testable or math.isnan(confidence):
            return NAN, NAN
        found = _scipy(self.test, self.arm, self.base).confidence_interval(confidence_level=confidence)
        return float(found.low[0]), float(found.high[0])  # the one row of the test


@functools.lru_cache(maxsize=1024)
def _scipy(test: str, arm: tuple, base: tuple):
    return _ttest(test, np.asarray([arm]), np.asarray([base]), 0.0, "two-sided")


def _ttest(test: str, arm: np.ndarray, base: np.ndarray, bound: float, alternative: str):
    """scipy's test of each row: H0 Δ = ``bound`` (two-sided), Δ <= bound (``greater``) or Δ >= bound (``less``)."""
    with warnings.catch_warnings():  # rows with no spread warn of cancellation; they are set aside by ``tied``
        warnings.simplefilter("ignore", RuntimeWarning)
        if test == "paired":
            return tests.ttest_1samp(arm - base, bound, axis=-1, alternative=alternative)
        return tests.ttest_ind(arm - bound, base, axis=-1, equal_var=False, alternative=alternative)


def scale_of(*samples: Sequence[float]) -> float:
    """The size of the values, against which a spread or a Δ counts as float rounding."""
    return max((abs(float(x)) for sample in samples for x in sample), default=0.0) or 1.0


def compare_rows(arm: np.ndarray, base: np.ndarray, *, paired: bool, margin: float) -> list[Comparison]:
    """Row i of ``arm`` [S, n_arm] against row i of ``base`` [S, n_base] (paired: the same seeds in the same order,
    n_arm = n_base >= 2; Welch: each side >= 2), TOST against ±``margin``: S comparisons in three scipy calls."""
    arm, base = np.asarray(arm, dtype=float), np.asarray(base, dtype=float)
    na, nb = arm.shape[-1], base.shape[-1]
    if paired:
        diffs = arm - base
        delta, spread = diffs.mean(axis=-1), diffs.std(axis=-1, ddof=1)
        se, df, variances = spread / math.sqrt(na), np.full(len(arm), na - 1.0), [(s * s,) for s in spread]
    else:
        va, vb = arm.var(axis=-1, ddof=1), base.var(axis=-1, ddof=1)
        delta, spread = arm.mean(axis=-1) - base.mean(axis=-1), np.sqrt(va / na + vb / nb)
        se, variances = spread, list(zip(va.tolist(), vb.tolist()))
        with np.errstate(divide="ignore", invalid="ignore"):
            df = (va / na + vb / nb) ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    sizes = np.maximum(np.abs(arm).max(axis=-1), np.abs(base).max(axis=-1))
    tied = spread <= TIE * np.where(sizes > 0, sizes, 1.0)
    test = "paired" if paired else "Welch"
    p = np.where(tied, NAN, _ttest(test, arm, base, 0.0, "two-sided").pvalue)
    above = _ttest(test, arm, base, -margin, "greater").pvalue  # H0 Δ <= -δ
    below = _ttest(test, arm, base, margin, "less").pvalue  # H0 Δ >= +δ
    p_equivalent = np.where(tied, NAN, np.maximum(above, below))
    out = []
    for i in range(len(arm)):
        df_i = NAN if tied[i] else float(df[i])
        out.append(Comparison(test, float(delta[i]), float(se[i]), df_i, variances[i], min(na, nb), bool(tied[i]),
                              float(p[i]), float(p_equivalent[i]), margin, tuple(arm[i].tolist()),
                              tuple(base[i].tolist())))  # fmt: skip
    return out


def compare(arm: Mapping[str, float], base: Mapping[str, float], *, margin: float) -> Comparison:
    """``arm`` and ``base`` map seed -> value. Paired when both ran the same seeds (two or more), else Welch; ""
    (no test) when a side has fewer than two."""
    if arm.keys() == base.keys() and len(arm) >= 2:
        seeds = sorted(arm)
        return compare_rows([[arm[s] for s in seeds]], [[base[s] for s in seeds]], paired=True, margin=margin)[0]
    a, b = list(arm.values()), list(base.values())
    if len(a) >= 2 and len(b) >= 2:
        return compare_rows([a], [b], paired=False, margin=margin)[0]
    return Comparison("", mean(a) - mean(b), NAN, NAN, (), min(len(a), len(b)), False, NAN, NAN, margin,
                      tuple(a), tuple(b))  # fmt: skip


def of_values(a: Sequence[float], b: Sequence[float], *, paired: bool, margin: float) -> Comparison:
    """``compare`` on two lists: paired by position (equally long), or as independent samples."""
    if paired and len(a) != len(b):
        raise ValueError(f"paired comparison of {len(a)} against {len(b)} values (valid: as many, in seed order)")
    if paired:
        return compare({str(i): x for i, x in enumerate(a)}, {str(i): x for i, x in enumerate(b)}, margin=margin)
    return compare({f"a{i}": x for i, x in enumerate(a)}, {f"b{i}": x for i, x in enumerate(b)}, margin=margin)
