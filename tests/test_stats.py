"""rlx_cli.studies.comparison, power, boundaries and stats against hand-computed values, closed forms and published
tables; the reproducers of the verdicts that broke their promises (issue 58)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special

from rlx_cli.studies import boundaries, comparison, power, stats
from rlx_cli.studies.comparison import compare, mean, of_values, std
from rlx_cli.studies.report_format import num, p_value, verdict_cell
from rlx_cli.studies.report_table import known_lower_is_better


def test_mean_and_sample_std():
    assert mean([1, 2, 3, 4]) == 2.5
    # ddof = 1: squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, / 3
    assert std([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3))
    assert math.isnan(std([0.7])) and math.isnan(mean([]))


def t2_upper_tail(t: float) -> float:
    """P(T >= t) for df = 2, in closed form: (1 - t / sqrt(2 + t²)) / 2."""
    return (1 - t / math.sqrt(2 + t * t)) / 2


T2_95 = math.sqrt(2 * 0.95**2 / (1 - 0.95**2))  # t_2 with P(|T| >= t) = 0.05, from 1 - t / sqrt(2 + t²) = 0.05


def test_paired_comparison_by_hand_with_two_degrees_of_freedom():
    a, b = [0.62, 0.65, 0.61], [0.60, 0.60, 0.60]
    diffs = [0.02, 0.05, 0.01]  # mean 0.08 / 3, sample sd of the differences, se = sd / sqrt(3), df = 2
    d = sum(diffs) / 3
    se = math.sqrt(sum((x - d) ** 2 for x in diffs) / 2) / math.sqrt(3)
    got = of_values(a, b, paired=True, margin=0.05)
    assert (got.test, got.df) == ("paired", 2.0) and got.delta == pytest.approx(d, abs=1e-12)
    assert got.p == pytest.approx(2 * t2_upper_tail(d / se), abs=1e-12)
    # TOST: H0 Δ <= -0.05 rejected at p = P(T >= (d + 0.05) / se); H0 Δ >= 0.05 at p = P(T <= (d - 0.05) / se)
    expected = max(t2_upper_tail((d + 0.05) / se), t2_upper_tail((0.05 - d) / se))
    assert got.p_equivalent == pytest.approx(expected, abs=1e-12) and 0.05 < expected < 0.1
    assert got.interval(0.95) == (pytest.approx(d - T2_95 * se), pytest.approx(d + T2_95 * se))
    assert got.sigma == pytest.approx(se * math.sqrt(3))


def test_paired_comparison_of_two_seeds_is_a_cauchy_tail():
    # n = 2: df = 1, P(|T| >= t) = 1 - 2/pi * atan(t); differences 0.1 and 0.3: mean 0.2, sd sqrt(0.02), se 0.1
    got = of_values([0.5, 0.7], [0.4, 0.4], paired=True, margin=0.02)
    assert got.p == pytest.approx(1 - 2 / math.pi * math.atan(2.0), abs=1e-12)


def test_welch_by_hand():
    a, b = [1, 2, 3, 4, 5], [2, 4, 6, 8, 10]
    # means 3 and 6; variances 2.5 and 10; s² / n = 0.5 and 2; t = -3 / sqrt(2.5)
    # df = 2.5² / (0.5² / 4 + 2² / 4) = 6.25 / 1.0625 = 5.88235...
    got = of_values(a, b, paired=False, margin=1.0)
    assert got.test == "Welch" and got.delta == -3 and got.se == pytest.approx(math.sqrt(2.5))
    assert got.df == pytest.approx(6.25 / 1.0625, abs=1e-12) and got.variances == (2.5, 10.0)
    assert got.p == pytest.approx(0.10753119493062728, abs=1e-10)  # R: t.test(a, b)$p.value = 0.1075


def test_welch_interval_with_two_seeds_a_side():
    # a = [0.8, 0.82], b = [0.5, 0.52]: s² = 0.0002 each, s²/n = 0.0001, SE sqrt(0.0002), df = 2
    got = of_values([0.8, 0.82], [0.5, 0.52], paired=False, margin=0.02)
    half = T2_95 * math.sqrt(0.0002)
    assert got.interval(0.95) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert half == pytest.approx(0.060849, abs=1e-6)
    assert got.p == pytest.approx(2 * t2_upper_tail(0.3 / math.sqrt(0.0002)), abs=1e-12)


def test_compare_pairs_only_shared_seeds():
    assert compare({"0": 0.5, "1": 0.6, "2": 0.7}, {"0": 0.4, "2": 0.5}, margin=0.02).test == "Welch"
    alone = compare({"0": 0.5}, {"0": 0.4, "1": 0.5}, margin=0.02)
    assert alone.test == "" and alone.delta == pytest.approx(0.05) and math.isnan(alone.p)
    assert math.isnan(alone.sigma) and not alone.testable
    with pytest.raises(ValueError, match="paired comparison of 4 against 3 values"):
        of_values([1, 2, 3, 4], [1, 2, 3], paired=True, margin=0.1)


def test_no_spread_is_no_p_and_equal_values_are_identical():
    # issue 58, 2: each seed one prompt of 200 apart, or 0.1 apart in decimal but not in binary
    for a, b, paired in (([0.96, 0.91], [0.955, 0.905], True), ([1.0, 1.0], [0.995, 0.995], False),
                         ([0.3, 0.4, 0.6], [0.2, 0.3, 0.5], True)):  # fmt: skip
        got = stats.verdict(a, b, margin=0.02, paired=paired)
        assert got.label == "inconclusive" and math.isnan(got.p) and math.isnan(got.p_equivalent)
        assert got.seeds_needed is None and got.why.startswith("no spread")
    same = stats.verdict([0.5, 0.7, 0.6], [0.5, 0.7, 0.6], margin=0.02)
    assert same.label == "identical" and math.isnan(same.p) and same.seeds_needed is None
    assert of_values([0.3, 0.4], [0.3, 0.4], paired=True, margin=0.02).identical


def test_holm_shaffer_adjusted_by_hand():
    # arm A: Δ = 0 rejected at p 0.001, |Δ| >= δ at 0.002; B: 0.02, 0.5; C: 0.3, 0.04. Ranked: A.D 0.001 with 3 arms
    # holding a hypothesis: 0.003; A.E 0.002, still 3 arms: 0.006; then A is done, 2 arms: B.D 0.02 -> 0.04, C.E
    # 0.04 -> 0.08, C.D 0.3 -> 0.6 (B and C still hold one), B.E 0.5 alone -> 0.5, kept at the running 0.6
    ps = {("A", "D"): 0.001, ("A", "E"): 0.002, ("B", "D"): 0.02, ("B", "E"): 0.5, ("C", "D"): 0.3, ("C", "E"): 0.04}
    got = stats.adjusted(ps)
    expected = {("A", "D"): 0.003, ("A", "E"): 0.006, ("B", "D"): 0.04, ("C", "E"): 0.08, ("C", "D"): 0.6,
                ("B", "E"): 0.6}  # fmt: skip
    assert got == {h: pytest.approx(p) for h, p in expected.items()}
    # plain Holm over the six would give B.D 4 × 0.02 = 0.08: not rejected; Shaffer's restriction rejects it
    assert math.isnan(stats.adjusted({("A", "D"): math.nan, ("A", "E"): 0.5})[("A", "D")])


def closed_test(ps: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """The closed test of Bonferroni tests over the consistent intersections (one hypothesis an arm at most)."""
    arms = sorted({arm for arm, _ in ps})
    out = {}
    for h in ps:
        worst = 0.0
        for choice in itertools.product(*[[None, (a, "D"), (a, "E")] for a in arms]):
            chosen = [c for c in choice if c is not None]
            if h in chosen:
                worst = max(worst, min(1.0, len(chosen) * min(ps[c] for c in chosen)))
        out[h] = worst
    return out


def holm(ps: dict) -> dict:
    ranked, out, running = sorted((p, h) for h, p in ps.items()), {}, 0.0
    for j, (p, h) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - j) * p))
        out[h] = running
    return out


def test_holm_shaffer_lies_between_the_closed_test_and_plain_holm_and_matches_its_step_down():
    rng = np.random.default_rng(5)
    judging = stats.Judging(margin=0.02)
    for _ in range(200):
        ps = {(a, k): float(rng.choice([rng.uniform(0, 0.06), rng.uniform(0, 1)])) for a in "ABC" for k in "DE"}
        got, closed, plain = stats.adjusted(ps), closed_test(ps), holm(ps)
        assert all(closed[h] - 1e-12 <= got[h] <= plain[h] + 1e-12 for h in ps)
        rejected: dict = {}
        fake = {a: (FakeComparison(ps[a, "D"], ps[a, "E"]), 0) for a in "ABC"}
        stats.step_down(fake, judging, stats.FIXED, rejected)
        assert set(rejected) == {h for h in ps if got[h] < 0.05}


class FakeComparison:
    """What the step-down reads of a comparison."""

    testable, margin = True, 0.02

    def __init__(self, p: float, p_equivalent: float):
        self.p, self.p_equivalent = p, p_equivalent


def test_boundaries_match_the_published_obrien_fleming_spending_bounds():
    # gsDesign sfLDOF, one-sided α 0.025, four equally spaced looks: z = 4.333, 2.963, 2.359, 2.014
    nominal = boundaries.nominal(0.025, (0.25, 0.5, 0.75, 1.0), "obf")
    z = [-float(np.round(special.ndtri(p), 3)) for p in nominal]
    assert z == [4.333, 2.963, 2.359, 2.014]
    assert boundaries.nominal(0.05, (1.0,)) == (0.05,)  # the fixed design: the level itself
    assert boundaries.spent(1.0, 0.03, "obf") == pytest.approx(0.03) and boundaries.spent(0.0, 0.03) == 0.0
    # Pocock-type: γ ln(1 + (e - 1) t); a quarter of the way, 0.3601 of γ
    assert boundaries.spent(0.25, 0.05) == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 4))
    assert boundaries.spent(1.0, 0.05) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="increasing"):
        boundaries.nominal(0.05, (0.5, 0.5))


@pytest.mark.parametrize("spending", ["pocock", "obf"])
def test_boundaries_spend_their_level_by_monte_carlo(spending):
    # Brownian motion at fractions 5/20 ... 20/20: the first crossings add up to γ, look by look as γ(t) says
    fractions, level = (0.25, 0.5, 0.75, 1.0), 0.05
    z_bounds = -special.ndtri(np.array(boundaries.nominal(level, fractions, spending)))
    rng = np.random.default_rng(3)
    steps = rng.normal(0, np.sqrt(np.diff((0,) + fractions)), (400_000, 4))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    crossed = (z >= z_bounds).cumsum(axis=1) > 0
    for k, t in enumerate(fractions):
        share = crossed[:, k].mean()
        assert abs(share - boundaries.spent(t, level, spending)) <= 3 * math.sqrt(level / 400_000)


def normal_power(effect: float, level: float) -> float:
    z = float(special.ndtri(1 - level / 2))
    return float(special.ndtr(effect - z) + special.ndtr(-effect - z))


def test_powers_reach_their_normal_limits():
    # df -> infinity: the t-tests are z-tests with closed forms
    for effect, level in ((1.0, 0.05), (2.8, 0.05), (3.5, 0.01)):
        assert power.power_of(effect, 1.0, 1e8, level) == pytest.approx(normal_power(effect, level), abs=1e-6)
    # MDE at 80% power, α 0.05: (z_0.975 + z_0.8) SE = 2.80158 SE
    assert power.detectable(0.01, 1e8, level=0.05) == pytest.approx(0.0280158, abs=1e-6)
    # TOST's bound: Φ((δ - Δ)/se - z) + Φ((δ + Δ)/se - z) - 1 with z one-sided at α
    phi, z = special.ndtr, 1.6448536269514722
    got = power.power_equivalent(0.005, (0.01**2 * 1000,), 1000, 0.02, 0.05)  # se = 0.01, df 999 ~ normal
    assert got == pytest.approx(float(phi(1.5 - z) + phi(2.5 - z) - 1), abs=2e-3)


def decides(delta: float, planned: tuple, m: int, level: float) -> bool:
    """80% power with m seeds: the t-test finds Δ, or (|Δ| < δ = 0.02) TOST's bound shows equivalence."""
    equivalent = abs(delta) < 0.02 and power.power_equivalent(delta, planned, m, 0.02, level) >= 0.8
    return power.power(delta, planned, m, level) >= 0.8 or equivalent


def test_seeds_to_decide_plans_past_the_pilot_and_reaches_its_power():
    for delta, sigma, n, level in ((0.03, 0.04, 5, 0.05), (0.005, 0.01, 5, 0.0125), (0.05, 0.02, 3, 0.05)):
        variances, df = (sigma**2,), n - 1.0
        needed = power.seeds_to_decide(delta, variances, n, df, margin=0.02, level=level)
        planned = power.planned_variances(variances, df)
        assert needed > n and planned[0] > sigma**2  # the 70% upper bound of the pilot's variance

        assert decides(delta, planned, needed, level) and (
            needed == n + 1 or not decides(delta, planned, needed - 1, level)
        )
    assert power.seeds_needed(0.1, (0.0,), alpha=0.05) is None  # no spread: nothing to plan from
    assert power.seeds_needed(1e-6, (1.0,), alpha=0.05) is None  # past 100,000 seeds


def test_seeds_to_decide_at_the_level_the_row_is_judged():
    # issue 58, 1: inconclusive at n = 10 named 9 seeds; now more than it ran, at the row's level
    a = [0.560558, 0.57515, 0.589742, 0.600274, 0.608778, 0.613222, 0.621726, 0.632258, 0.64685, 0.661442]
    b = [0.58, 0.584444, 0.588889, 0.593333, 0.597778, 0.602222, 0.606667, 0.611111, 0.615556, 0.62]
    got = stats.verdict(a, b, margin=0.02)
    assert got.label == "inconclusive" and got.seeds_needed > 10


def test_the_interval_beside_a_label_is_the_one_that_decided_it():
    # issue 58, 3: equivalent from TOST at α: its 1 - 2α = 90% interval lies inside ±δ (the 95% one does not)
    got = stats.verdict([0.61, 0.59, 0.60], [0.60, 0.60, 0.60], margin=0.02)
    assert got.label == "equivalent" and got.level == pytest.approx(0.90)
    # differences 0.01, -0.01, 0: sd 0.01, se 0.01 / sqrt(3); t_2 one-sided at 0.05 from 1 - t / sqrt(2 + t²) = 0.1
    half_90, half_95 = math.sqrt(2 * 0.9**2 / (1 - 0.9**2)) * 0.01 / math.sqrt(3), T2_95 * 0.01 / math.sqrt(3)
    assert got.interval == (pytest.approx(-half_90), pytest.approx(half_90)) and half_90 < 0.02 < half_95
    # in a family the interval is at the row's level: inconclusive rows' intervals hold 0, decided ones leave it out
    rng, judging = np.random.default_rng(4), stats.Judging(margin=0.02)
    for _ in range(50):
        base = rng.normal(0.6, 0.05, 5)
        arms = {i: base + d + rng.normal(0, 0.02, 5) for i, d in enumerate((0.0, 0.01, 0.02, 0.03, 0.05))}
        family = {i: (of_values(a.tolist(), base.tolist(), paired=True, margin=0.02), 0) for i, a in arms.items()}
        for v in stats.judge(family, judging).values():
            assert (v.low > 0 or v.high < 0) == (v.label in ("better", "worse"))
            assert v.label != "equivalent" or (-0.02 < v.low and v.high < 0.02)


def test_a_significant_difference_inside_the_margin_reads_within():
    got = stats.verdict([0.61, 0.612, 0.611, 0.6105], [0.60, 0.60, 0.60, 0.60], margin=0.02)
    assert got.label == "better" and got.within
    row = {"verdict": got.label, "within_margin": got.within, "seeds_needed": None, "why": ""}
    assert verdict_cell(row) == "better (within δ)"


def test_verdict_labels_and_their_direction():
    up, base = [0.8, 0.82, 0.81, 0.83], [0.5, 0.51, 0.52, 0.5]
    assert stats.verdict(up, base, margin=0.02).label == "better"
    assert stats.verdict(base, up, margin=0.02).label == "worse"
    assert stats.verdict(up, base, margin=0.02, lower_is_better=True).label == "worse"  # a loss that rose
    one = stats.verdict([0.5], [0.4], margin=0.02)
    assert one.label == "inconclusive" and one.seeds_needed is None and math.isnan(one.p)
    welch = stats.verdict(up, base[:3], margin=0.02, paired=False)
    assert welch.label == "better" and welch.p == pytest.approx(of_values(up, base[:3], paired=False, margin=1).p)
    # issue 58, 6: rates are higher-is-better, times and losses lower
    assert not known_lower_is_better("perf/tokens_per_s") and known_lower_is_better("perf/step_s")
    assert known_lower_is_better("train/loss") and known_lower_is_better("train/rollout_kl")


@pytest.mark.parametrize("alpha", [0.6, 0.5, 0.0, 1.0, -0.1])
def test_alpha_outside_what_tost_allows_is_refused(alpha):
    with pytest.raises(ValueError, match=rf"alpha {alpha} is not valid \(valid: above 0 and below 0.5"):
        stats.verdict([0.5, 0.6], [0.4, 0.5], margin=0.02, alpha=alpha)


def test_formats_that_do_not_mislead():
    assert p_value(0.0497, 0.05) == "0.0497" and p_value(0.0503, 0.05) == "0.050"  # "0.050" only at or above α
    assert p_value(0.0412, 0.05) == "0.041" and p_value(0.0004, 0.05) == "<0.001"
    assert num(2005) == "2,005" and num(23680.0) == "23,680" and num(0.0004) == "0.0004"
    cell = {"verdict": "inconclusive", "within_margin": False, "seeds_needed": 2005, "why": ""}
    assert verdict_cell(cell) == "inconclusive (2,005 seeds)"


def test_compare_rows_runs_many_comparisons_as_compare_runs_one():
    rng = np.random.default_rng(6)
    a, b = rng.normal(0.6, 0.05, (4, 5)), rng.normal(0.58, 0.05, (4, 5))
    for paired in (True, False):
        many = comparison.compare_rows(a, b, paired=paired, margin=0.02)
        for i, got in enumerate(many):
            one = of_values(a[i].tolist(), b[i].tolist(), paired=paired, margin=0.02)
            assert (got.p, got.p_equivalent, got.df) == (one.p, one.p_equivalent, one.df)
