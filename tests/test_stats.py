"""rlx_cli.studies.stats: the t-tests, Holm, power and detectable effects against hand-computed values and scipy."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rlx_cli.studies import stats


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


def welch_of(a: list[float], b: list[float]) -> stats.Comparison:
    """``compare`` on samples with no seed in common: Welch's test."""
    return stats.compare({f"a{i}": x for i, x in enumerate(a)}, {f"b{i}": x for i, x in enumerate(b)})


def test_welch_ci_by_hand():
    # a = [0.8, 0.82], b = [0.5, 0.52]: Δ 0.3, SE sqrt(0.0001 + 0.0001), df 2 -> Δ ± 4.30265 · 0.0141421
    got = welch_of([0.8, 0.82], [0.5, 0.52])
    half = math.sqrt(2 * 0.95**2 / (1 - 0.95**2)) * math.sqrt(0.0002)
    assert got.test == "Welch" and (got.low, got.high) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert half == pytest.approx(0.060849, abs=1e-6)
    # the interval excludes 0 exactly when Welch's p < 0.05
    for a, b in (([0.5, 0.6, 0.7], [0.4, 0.45, 0.5]), ([0.5, 0.52, 0.51], [0.4, 0.45, 0.42])):
        got = welch_of(a, b)
        assert (got.low > 0) == (got.p < 0.05) and got.p == stats.welch(a, b)[2]
    no_spread = welch_of([0.6, 0.6, 0.6], [0.5, 0.5])
    assert (no_spread.low, no_spread.high) == (pytest.approx(0.1), pytest.approx(0.1)) and no_spread.p == 0.0


def test_welch_ci_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for a, b in random_pairs(1, 20, 6):
        t, df, _ = stats.welch(a, b)
        half = float(scipy_stats.t.ppf(0.975, df)) * (stats.mean(a) - stats.mean(b)) / t
        got = welch_of(a, b)
        assert got.high - got.low == pytest.approx(2 * abs(half), rel=1e-7)


def random_paired(seed: int, count: int, max_n: int):
    """``count`` pairs of equally long samples (2..max_n values) that share a per-seed effect, as arms do."""
    rng = random.Random(seed)
    for _ in range(count):
        shared = [rng.gauss(0, 1) for _ in range(rng.randint(2, max_n))]
        yield [s + rng.gauss(0.3, 0.5) for s in shared], [s + rng.gauss(0, 0.5) for s in shared]


def test_paired_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for a, b in random_paired(2, 50, 9):
        ref = scipy_stats.ttest_rel(a, b)
        t, df, p = stats.paired(a, b)
        assert t == pytest.approx(float(ref.statistic), rel=1e-9) and p == pytest.approx(float(ref.pvalue), abs=1e-9)
        assert df == len(a) - 1


def test_compare_pairs_arms_that_share_seeds_and_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for a, b in random_paired(3, 20, 6):
        seeds = [str(s) for s in range(len(a))]
        got = stats.compare(dict(zip(seeds, a)), dict(zip(seeds, b)))
        ref = scipy_stats.ttest_rel(a, b)
        low, high = ref.confidence_interval(0.95)
        assert got.test == "paired" and got.delta == pytest.approx(stats.mean(a) - stats.mean(b), abs=1e-12)
        assert (got.low, got.high) == (pytest.approx(float(low), rel=1e-9), pytest.approx(float(high), rel=1e-9))
        assert got.p == pytest.approx(float(ref.pvalue), abs=1e-9)
        assert got.sigma == pytest.approx(float(scipy_stats.tstd([x - y for x, y in zip(a, b)])), rel=1e-9)


def test_compare_falls_back_to_welch_when_the_seeds_differ():
    scipy_stats = pytest.importorskip("scipy.stats")
    for a, b in random_pairs(4, 20, 6):
        got = welch_of(a, b)
        ref = scipy_stats.ttest_ind(a, b, equal_var=False)
        low, high = ref.confidence_interval(0.95)
        assert got.test == "Welch" and got.p == pytest.approx(float(ref.pvalue), abs=1e-9)
        assert (got.low, got.high) == (pytest.approx(float(low), rel=1e-9), pytest.approx(float(high), rel=1e-9))
    # seed 1 only in the arm: not the same seeds, so Welch on all values; one seed on a side: no test
    assert stats.compare({"0": 0.5, "1": 0.6, "2": 0.7}, {"0": 0.4, "2": 0.5}).test == "Welch"
    alone = stats.compare({"0": 0.5}, {"0": 0.4, "1": 0.5})
    assert alone.test == "" and alone.delta == pytest.approx(0.05) and math.isnan(alone.p)
    assert math.isnan(alone.detectable) and math.isnan(alone.sigma)


def test_holm_by_hand_as_r_p_adjust():
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = stats.holm([0.2, math.nan, 0.9, 0.01])  # NaN: no test for that arm, m = 3
    assert adjusted[0] == pytest.approx(0.4) and math.isnan(adjusted[1]) and adjusted[2:] == pytest.approx([0.9, 0.03])
    assert stats.holm([]) == [] and stats.holm([0.6, 0.7]) == [1.0, 1.0]


def closed_testing_holm(p_values: list[float]) -> list[float]:
    """Holm as the closed test of Bonferroni tests: the largest Bonferroni p of any intersection holding H_i."""
    from itertools import combinations

    m = len(p_values)
    return [
        max(min(1.0, len(s) * min(p_values[j] for j in s)) for k in range(1, m + 1)
            for s in combinations(range(m), k) if i in s)
        for i in range(m)
    ]  # fmt: skip


def test_holm_of_scipy_p_values_equals_the_closed_testing_definition():
    scipy_stats = pytest.importorskip("scipy.stats")
    base_rng = random.Random(5)
    for _ in range(10):
        base = [base_rng.gauss(0, 1) for _ in range(4)]
        arms = [[x + base_rng.gauss(effect, 0.6) for x in base] for effect in (0.0, 0.4, 0.8, 1.5, -0.7)]
        p_values = [float(scipy_stats.ttest_rel(arm, base).pvalue) for arm in arms]
        assert stats.holm(p_values) == pytest.approx(closed_testing_holm(p_values), abs=1e-12)


@pytest.mark.parametrize("df", [1, 2, 3.5, 4, 9, 30])
def test_noncentral_t_cdf_matches_scipy(df):
    scipy_stats = pytest.importorskip("scipy.stats")
    for nc in (-2.0, 0.0, 0.5, 2.8, 5.0):
        for t in (-3.0, -0.5, 0.0, 0.7, 2.1, 6.0):
            assert stats.nct_cdf(t, df, nc) == pytest.approx(float(scipy_stats.nct.cdf(t, df, nc)), abs=1e-10)
    # nc = 0 is Student's t: P(T <= t) = 1 - p/2 for t > 0
    assert stats.nct_cdf(2.0, df, 0.0) == pytest.approx(1 - stats.t_two_sided_p(2.0, df) / 2, abs=1e-12)


def scipy_power(nc: float, df: float) -> float:
    """Two-sided power at α = 0.05 by scipy (its far lower tail is NaN past nc ≈ 8, where it is 0 to 1e-14)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    critical = float(scipy_stats.t.ppf(0.975, df))
    lower = float(scipy_stats.nct.cdf(-critical, df, nc))
    return float(scipy_stats.nct.sf(critical, df, nc)) + (0.0 if math.isnan(lower) else lower)


@pytest.mark.parametrize("df", [1, 2, 4, 9, 4.7])
def test_detectable_effect_matches_scipy(df):
    optimize = pytest.importorskip("scipy.optimize")
    expected = optimize.brentq(lambda nc: scipy_power(nc, df) - 0.8, 0.1, 30, xtol=1e-12)
    assert stats.detectable(1.0, df) == pytest.approx(expected, rel=1e-8)
    assert stats.detectable(0.02, df) == pytest.approx(0.02 * expected, rel=1e-8)  # in units of the standard error
    assert stats.power(expected, df) == pytest.approx(0.8, abs=1e-9)


def test_compare_detectable_effect_has_80_percent_power_by_scipy():
    for a, b in random_paired(6, 5, 6):
        seeds = [str(s) for s in range(len(a))]
        got = stats.compare(dict(zip(seeds, a)), dict(zip(seeds, b)))
        se = got.sigma / math.sqrt(len(a))
        assert scipy_power(got.detectable / se, len(a) - 1) == pytest.approx(0.8, abs=1e-7)
    for a, b in random_pairs(7, 5, 6):
        got = welch_of(a, b)
        _, se, df = stats._difference(a, b)
        assert scipy_power(got.detectable / se, df) == pytest.approx(0.8, abs=1e-7)


@pytest.mark.parametrize(("delta", "variances"), [(0.02, (0.012**2,)), (0.05, (0.04**2,)), (0.02, (0.01**2, 0.015**2)),
                                                   (0.1, (0.05**2, 0.05**2)), (1.0, (0.1**2,))])  # fmt: skip
def test_seeds_needed_matches_a_scan_with_scipy(delta, variances):
    pytest.importorskip("scipy.stats")

    def scipy_enough(n: int) -> bool:
        se = math.sqrt(sum(variances) / n)
        df = n - 1 if len(variances) == 1 else (n - 1) * sum(variances) ** 2 / sum(v * v for v in variances)
        return scipy_power(delta / se, df) >= 0.8

    expected = next(n for n in range(2, 1000) if scipy_enough(n))
    assert stats.seeds_needed(delta, variances) == expected
    assert stats.seeds_needed(-delta, variances) == expected  # a drop as large needs as many


def test_seeds_needed_edges():
    assert stats.seeds_needed(0.1, (0.0,)) == 2  # no spread: the fewest a t-test takes
    assert stats.seeds_needed(1e-6, (1.0,)) is None  # past 100,000 seeds
    assert stats.seeds_needed(0.1, (math.nan,)) is None


def t2_upper_tail(t: float) -> float:
    """P(T >= t) for df = 2, in closed form: (1 - t / sqrt(2 + t²)) / 2."""
    return (1 - t / math.sqrt(2 + t * t)) / 2


def test_verdict_by_hand_with_two_degrees_of_freedom():
    a, b = [0.62, 0.65, 0.61], [0.60, 0.60, 0.60]
    diffs = [0.02, 0.05, 0.01]  # mean 0.08 / 3, sample sd from the squared deviations, se = sd / sqrt(3), df = 2
    d = sum(diffs) / 3
    se = math.sqrt(sum((x - d) ** 2 for x in diffs) / 2) / math.sqrt(3)
    got = stats.verdict(a, b, margin=0.05)
    assert got.delta == pytest.approx(d, abs=1e-12) and got.p == pytest.approx(2 * t2_upper_tail(d / se), abs=1e-12)
    # TOST: H0 Δ <= -0.05 rejected at p = P(T >= (d + 0.05) / se); H0 Δ >= 0.05 at p = P(T <= (d - 0.05) / se)
    p_equivalent = max(t2_upper_tail((d + 0.05) / se), t2_upper_tail((0.05 - d) / se))
    assert got.p_equivalent == pytest.approx(p_equivalent, abs=1e-12) and 0.05 < p_equivalent < 0.1
    half = math.sqrt(2 * 0.95**2 / (1 - 0.95**2)) * se  # t_2(0.05) from 1 - t / sqrt(2 + t²) = 0.05
    assert (got.low, got.high) == (pytest.approx(d - half), pytest.approx(d + half))
    assert got.label == "inconclusive"
    # to decide, the t-test must find max(|Δ|, δ) = 0.05 with 80% power at the spread of these differences
    assert got.seeds_needed == stats.seeds_needed(0.05, ((se * se) * 3,))
    wide = stats.verdict(a, b, margin=0.1)  # the 0.1 margin: p = max(P(T >= 10.5), P(T >= 6.1)) = 0.013
    assert wide.label == "equivalent" and wide.p_equivalent == pytest.approx(t2_upper_tail((0.1 - d) / se))
    assert wide.seeds_needed is None


def test_verdict_labels_and_their_direction():
    up, base = [0.8, 0.82, 0.81, 0.83], [0.5, 0.51, 0.52, 0.5]
    assert stats.verdict(up, base, margin=0.02).label == "better"
    assert stats.verdict(base, up, margin=0.02).label == "worse"
    assert stats.verdict(up, base, margin=0.02, lower_is_better=True).label == "worse"  # a loss that rose
    assert stats.label(-0.1, 0.01, 0.9, lower_is_better=True) == "better"
    assert stats.label(0.1, math.nan, math.nan) == "inconclusive"  # no test at all
    same = stats.verdict([0.5, 0.5], [0.5, 0.5], margin=0.02)  # no spread, equal: p = 1, certainly within δ
    assert (same.label, same.p, same.p_equivalent) == ("equivalent", 1.0, 0.0)
    one = stats.verdict([0.5], [0.4], margin=0.02)
    assert one.label == "inconclusive" and one.seeds_needed is None and math.isnan(one.p)
    welch = stats.verdict(up, base[:3], margin=0.02, paired=False)
    assert welch.label == "better" and welch.p == pytest.approx(stats.welch(up, base[:3])[2])
    with pytest.raises(ValueError, match="paired verdict of 4 against 3 values"):
        stats.verdict(up, base[:3], margin=0.02)


def calibration(rng, n: int, count: int, *, delta: float, arm_sd: float, seed_sd: float = 1.0, paired: bool = True,
                margin: float = 0.02):  # fmt: skip
    """``count`` verdicts on synthetic seeds: a shared per-seed effect N(0, seed_sd) in both arms (as a seed's prompts
    and draws are), each arm's own noise N(0, arm_sd), the arm ``delta`` above the baseline."""
    shared = rng.normal(0.0, seed_sd, (count, n))
    arms = shared + delta + rng.normal(0.0, arm_sd, (count, n))
    bases = shared + rng.normal(0.0, arm_sd, (count, n))
    return [stats.verdict(a.tolist(), b.tolist(), margin=margin, paired=paired) for a, b in zip(arms, bases)]


def slack(rate: float, count: int) -> float:
    """Three binomial standard deviations of a rate measured over ``count`` trials."""
    return 3 * math.sqrt(rate * (1 - rate) / count)


def test_calibration_no_difference_gives_few_false_verdicts():
    rng = np.random.default_rng(0)
    verdicts = calibration(rng, 5, 1000, delta=0.0, arm_sd=0.05)
    false = sum(v.label in ("better", "worse") for v in verdicts) / 1000
    assert false <= 0.05 + slack(0.05, 1000)


def test_calibration_equivalence_and_difference_have_power():
    rng, margin = np.random.default_rng(1), 0.02
    equal = calibration(rng, 10, 1000, delta=0.0, arm_sd=margin / 3, margin=margin)
    assert sum(v.label == "equivalent" for v in equal) / 1000 >= 0.8
    apart = calibration(rng, 10, 1000, delta=3 * margin, arm_sd=margin, margin=margin)
    assert sum(v.label == "better" for v in apart) / 1000 >= 0.8


@pytest.mark.parametrize("paired", [True, False])
def test_calibration_the_interval_covers_the_true_difference(paired):
    rng = np.random.default_rng(2)
    verdicts = calibration(rng, 5, 1000, delta=0.03, arm_sd=0.04, seed_sd=0.0 if not paired else 1.0, paired=paired)
    covered = sum(v.low <= 0.03 <= v.high for v in verdicts) / 1000
    assert abs(covered - 0.95) <= 0.02
