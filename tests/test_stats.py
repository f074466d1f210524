"""rlx_cli.stats: Welch's t-test and the bootstrap CI against numbers you can check by hand."""

from __future__ import annotations

import math
import random

import pytest

from rlx_cli import stats


def test_mean_and_sample_std():
    assert stats.mean([1, 2, 3, 4]) == 2.5
    # ddof = 1: squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, / 3
    assert stats.std([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3))
    assert math.isnan(stats.std([0.7])) and math.isnan(stats.mean([]))


@pytest.mark.parametrize(
    ("a", "b", "x", "expected"),
    [
        (1, 1, 0.3, 0.3),  # I_x(1, 1) = x
        (3, 1, 0.6, 0.6**3),  # I_x(a, 1) = x^a
        (1, 4, 0.2, 1 - 0.8**4),  # I_x(1, b) = 1 - (1 - x)^b
        (2.5, 2.5, 0.5, 0.5),  # symmetry
        (7.0, 0.5, 0.0, 0.0),
        (7.0, 0.5, 1.0, 1.0),
    ],
)
def test_incomplete_beta_closed_forms(a, b, x, expected):
    assert stats.betainc(a, b, x) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0, 2.0, 12.7])
def test_t_p_values_for_one_and_two_degrees_of_freedom(t):
    # df = 1 is the Cauchy distribution: P(|T| >= t) = 1 - 2/pi * atan(t)
    assert stats.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)
    # df = 2: P(|T| >= t) = 1 - t / sqrt(2 + t^2)
    assert stats.t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


def test_welch_by_hand():
    a, b = [1, 2, 3, 4, 5], [2, 4, 6, 8, 10]
    # means 3 and 6; variances 2.5 and 10; s² / n = 0.5 and 2; t = -3 / sqrt(2.5)
    # df = 2.5² / (0.5² / 4 + 2² / 4) = 6.25 / 1.0625 = 5.88235...
    t, df, p = stats.welch(a, b)
    assert t == pytest.approx(-3 / math.sqrt(2.5), abs=1e-12)
    assert df == pytest.approx(6.25 / 1.0625, abs=1e-12)
    assert p == pytest.approx(0.10753119493062728, abs=1e-10)  # R: t.test(a, b)$p.value = 0.1075


def test_welch_with_two_seeds_a_side():
    # a = [0.8, 0.82], b = [0.5, 0.52]: s² = 0.0002 each, s²/n = 0.0001, t = 0.3 / sqrt(0.0002), df = 2
    t, df, p = stats.welch([0.8, 0.82], [0.5, 0.52])
    assert t == pytest.approx(0.3 / math.sqrt(0.0002)) and df == pytest.approx(2.0)
    assert p == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


def test_welch_edge_cases():
    assert all(math.isnan(v) for v in stats.welch([1.0], [1.0, 2.0]))
    assert stats.welch([1.0, 1.0], [1.0, 1.0])[2] == 1.0  # no spread, equal means
    assert stats.welch([2.0, 2.0], [1.0, 1.0])[2] == 0.0  # no spread, different means


def random_pairs(seed: int, count: int, max_n: int):
    """``count`` pairs of samples (2..max_n values each) from N(0, 1) and N(0.4, 2²)."""
    rng = random.Random(seed)
    for _ in range(count):
        yield (
            [rng.gauss(0, 1) for _ in range(rng.randint(2, max_n))],
            [rng.gauss(0.4, 2) for _ in range(rng.randint(2, max_n))],
        )


def test_welch_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for a, b in random_pairs(0, 50, 9):
        ref = scipy_stats.ttest_ind(a, b, equal_var=False)
        t, _, p = stats.welch(a, b)
        assert t == pytest.approx(float(ref.statistic), rel=1e-9) and p == pytest.approx(float(ref.pvalue), abs=1e-9)


@pytest.mark.parametrize(
    ("df", "expected"),
    [
        (1, math.tan(math.pi / 2 * 0.95)),  # Cauchy: 12.7062
        (2, math.sqrt(2 * 0.95**2 / (1 - 0.95**2))),  # from 1 - t / sqrt(2 + t²) = 0.05: 4.3027
        (1e9, 1.959963984540054),  # the normal limit
    ],
)
def test_t_quantile_closed_forms(df, expected):
    assert stats.t_quantile(0.05, df) == pytest.approx(expected, rel=1e-6)


def test_welch_ci_by_hand():
    # a = [0.8, 0.82], b = [0.5, 0.52]: Δ 0.3, SE sqrt(0.0001 + 0.0001), df 2 -> Δ ± 4.30265 · 0.0141421
    low, high = stats.welch_ci([0.8, 0.82], [0.5, 0.52])
    half = math.sqrt(2 * 0.95**2 / (1 - 0.95**2)) * math.sqrt(0.0002)
    assert (low, high) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert half == pytest.approx(0.060849, abs=1e-6)
    # the interval excludes 0 exactly when Welch's p < 0.05
    for a, b in (([0.5, 0.6, 0.7], [0.4, 0.45, 0.5]), ([0.5, 0.52, 0.51], [0.4, 0.45, 0.42])):
        low, high = stats.welch_ci(a, b)
        assert (low > 0) == (stats.welch(a, b)[2] < 0.05)
    assert stats.welch_ci([0.6, 0.6, 0.6], [0.5, 0.5]) == (pytest.approx(0.1), pytest.approx(0.1))  # no spread
    assert all(math.isnan(v) for v in stats.welch_ci([1.0], [1.0, 2.0]))


def test_welch_ci_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for a, b in random_pairs(1, 20, 6):
        t, df, _ = stats.welch(a, b)
        half = float(scipy_stats.t.ppf(0.975, df)) * (stats.mean(a) - stats.mean(b)) / t
        low, high = stats.welch_ci(a, b)
        assert high - low == pytest.approx(2 * abs(half), rel=1e-7)
