"""ScaleRL's sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B): recovery from synthetic curves with known
parameters, refusals, the bootstrap's coverage over seeds, extrapolation and the paired difference of two arms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_cli.config.errors import UserError
from rlx_cli.studies.scaling_fit import (
    SigmoidFit,
    bootstrap,
    extrapolation_error,
    fit_pooled,
    fit_sigmoid,
    paired_difference,
    plot_fits,
)

X = np.linspace(100, 20000, 40)  # compute, e.g. GPU-hours
SETS = [(0.8, 1.5, 2000.0, 0.2), (0.6, 2.5, 5000.0, 0.1)]  # (A, B, C_mid, R0)


def sigmoid(x, a, b, c_mid, r0):
    return r0 + (a - r0) / (1 + (c_mid / np.asarray(x, dtype=float)) ** b)


def test_predict_by_hand():
    fit = SigmoidFit(a=0.8, b=1.5, c_mid=2000.0, r0=0.2, sse=0.0, n=4)
    # at C_mid half the gain: 0.2 + 0.6 / 2; at 4 C_mid: (1/4)^1.5 = 1/8 -> 0.2 + 0.6 / 1.125
    assert fit.predict(np.array([2000.0, 8000.0])) == pytest.approx([0.5, 0.2 + 0.6 / 1.125])
    assert fit.predict(1e12) == pytest.approx(0.8) and fit.predict(1e-6) == pytest.approx(0.2)


@pytest.mark.parametrize("a, b, c_mid, r0", SETS)
def test_clean_curve_is_recovered_exactly(a, b, c_mid, r0):
    fit = fit_sigmoid(X, sigmoid(X, a, b, c_mid, r0), r0=r0)
    assert (fit.a, fit.b, fit.c_mid, fit.r0, fit.n) == pytest.approx((a, b, c_mid, r0, 40), rel=1e-6)
    assert fit.sse < 1e-20


def test_r0_defaults_to_the_first_point():
    a, b, c_mid, r0 = SETS[1]  # at C = 100 the curve is still within 3e-5 of R0 = 0.1
    fit = fit_sigmoid(X, sigmoid(X, a, b, c_mid, r0))
    assert fit.r0 == sigmoid(100, a, b, c_mid, r0) == pytest.approx(0.1, abs=3e-5)
    assert (fit.a, fit.b, fit.c_mid) == pytest.approx((a, b, c_mid), rel=2e-3)


@pytest.mark.parametrize("a, b, c_mid, r0, given", [(*SETS[0], True), (*SETS[1], False)])
def test_noisy_curves_are_recovered_within_2_percent(a, b, c_mid, r0, given):
    # Gaussian noise sd 0.005 on R. One 40-point curve pins B only to ~2% (22-34% of noise draws miss 2% on B or
    # C_mid), so each draw must get A within 2%, and the mean of 20 draws A, B and C_mid (for 40 RNG seeds: at most
    # 1.6% and 1.7% off). R0 is given where the curve has already risen at C = 100 (set 1: 0.207 there), else it is
    # the first point's value; R0 from a risen first point biases the fit (set 1: C_mid ~2% off on average).
    rng = np.random.default_rng(0)
    fits = [fit_sigmoid(X, sigmoid(X, a, b, c_mid, r0) + rng.normal(0, 0.005, X.size), r0=r0 if given else None)
            for _ in range(20)]  # fmt: skip
    errors = np.array([[f.a / a - 1, f.b / b - 1, f.c_mid / c_mid - 1] for f in fits])
    assert np.abs(errors[:, 0]).max() < 0.02
    assert np.abs(errors.mean(axis=0)).max() < 0.02


def test_a_may_lie_below_the_highest_point():
    # a saturated noisy curve: its highest points lie above A by the noise, so A is searched from R0 up, not from max R
    x = np.linspace(1000, 200_000, 40)  # ~35 points within 0.01 of A; the fit pins A to ~0.002 (sd)
    y = sigmoid(x, 0.8, 1.5, 2000.0, 0.2) + np.random.default_rng(5).normal(0, 0.01, x.size)
    fit = fit_sigmoid(x, y, r0=0.2)
    assert y.max() > 0.81 and fit.a == pytest.approx(0.8, abs=0.006)


def test_fit_from_drops_the_early_points():
    a, b, c_mid, r0 = SETS[0]
    y = sigmoid(X, a, b, c_mid, r0)
    y[X < 1500] = 0.95  # a noisy start the fit must not see
    fit = fit_sigmoid(X, y, fit_from=1500, r0=r0)
    assert fit.n == int((X >= 1500).sum()) == 37  # C = 100, 610, 1121 dropped
    assert (fit.a, fit.b, fit.c_mid) == pytest.approx((a, b, c_mid), rel=1e-6)
    assert fit_sigmoid(X, y, fit_from=1500).r0 == pytest.approx(sigmoid(X[X >= 1500][0], a, b, c_mid, r0))


def test_refuses_too_few_points_in_one_line():
    y = sigmoid(X, *SETS[0])
    with pytest.raises(UserError) as error:
        fit_sigmoid(X[:3], y[:3])
    assert str(error.value) == "the sigmoid fit needs at least 4 points after --fit-from 0 (the run has 3)"
    with pytest.raises(UserError, match=r"after --fit-from 19000 \(the run has 2\)"):
        fit_sigmoid(X, y, fit_from=19000)
    with pytest.raises(UserError, match=r"\(run 3 of 3 has 3\)") as error:
        fit_pooled([(X, y), (X, y), (X[:3], y[:3])])
    assert "\n" not in str(error.value)
    fit_sigmoid(X[:4], y[:4])  # 4 points: enough for A, B, C_mid and R0


def test_refuses_bad_input():
    y = sigmoid(X, *SETS[0])
    with pytest.raises(UserError, match="positive compute values"):
        fit_sigmoid(np.r_[0.0, X[1:]], y)
    with pytest.raises(UserError, match="equal length"):
        fit_sigmoid(X, y[:-1])
    with pytest.raises(UserError, match="a_max=1 but R reaches 1.18"):
        fit_sigmoid(X, y + 0.4)
    assert fit_sigmoid(X, y + 0.4, a_max=2.0, r0=0.6).a == pytest.approx(1.2, rel=1e-6)
    with pytest.raises(UserError, match="at least 2 runs"):
        bootstrap([(X, y)])


@pytest.mark.parametrize("y", [np.full(10, 0.3), np.linspace(0.3, 0.1, 10)], ids=["flat", "falling"])
def test_a_curve_that_never_rises_has_a_equal_to_r0(y):
    fit = fit_sigmoid(np.arange(1.0, 11.0), y)
    assert fit.a == fit.r0 == 0.3 and math.isnan(fit.b) and math.isnan(fit.c_mid)
    assert fit.predict(np.array([1.0, 1e6])) == pytest.approx([0.3, 0.3])
    assert fit.sse == pytest.approx(((y - 0.3) ** 2).sum())


def seeds(rng, n, a, b=1.5, c_mid=2000.0, r0=0.2, x=np.geomspace(10, 20000, 40), offsets=None):
    """``n`` seeds of an arm: each its own A (around ``a``, sd 0.01, or ``a`` + ``offsets``) plus noise sd 0.005."""
    offsets = rng.normal(0, 0.01, n) if offsets is None else offsets
    return [(x, sigmoid(x, a + o, b, c_mid, r0) + rng.normal(0, 0.005, x.size)) for o in offsets]


def test_bootstrap_interval_covers_the_true_a():
    # 100 synthetic studies of 20 seeds with the true A = 0.8 (the C -> 0 end is at R0 from C = 10 on, so R0 from the
    # data is unbiased). Observed: 94/100 (the plain percentile interval: 92/100). With few seeds no interval from
    # resampling can cover more often than 1 - 2^(1 - n), the chance that the truth lies within the seeds' range.
    rng = np.random.default_rng(7)
    covered = 0
    for i in range(100):
        low, high = bootstrap(seeds(rng, 20, 0.8), replicates=200, seed=i, grid=20)["a"]
        covered += low <= 0.8 <= high
    assert covered >= 90


def test_bootstrap_returns_intervals_around_the_fit():
    curves = seeds(np.random.default_rng(1), 5, 0.8)
    fit = fit_pooled(curves)
    intervals = bootstrap(curves, replicates=300)
    for name in ("a", "b", "c_mid", "r0"):
        low, high = intervals[name]
        assert low < getattr(fit, name) < high
    assert bootstrap(curves, replicates=300) == intervals  # the same seed, the same draws
    plain = bootstrap(curves, replicates=300, expand=False)["a"]
    assert intervals["a"][0] < plain[0] < plain[1] < intervals["a"][1]


def test_extrapolation_from_the_first_half_of_the_budget():
    a, b, c_mid, r0 = SETS[0]  # C_mid = 2000 lies in the first half of the budget 20000
    predicted, observed, error = extrapolation_error([(X, sigmoid(X, a, b, c_mid, r0))])
    assert observed == pytest.approx(0.2 + 0.6 / (1 + 0.1**1.5))  # (2000 / 20000)^1.5 = 0.1^1.5
    assert error == abs(predicted - observed) < 0.01
    curves = seeds(np.random.default_rng(2), 5, 0.8, x=X)
    predicted, observed, error = extrapolation_error(curves)
    assert observed == pytest.approx(np.mean([y[-1] for _, y in curves])) and error < 0.01


def test_paired_difference_of_two_arms():
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 0.01, 5)  # seed s is as lucky in both arms: pairing removes it
    arm, baseline = seeds(rng, 5, 0.80, offsets=shared), seeds(rng, 5, 0.75, offsets=shared)
    diff = paired_difference(arm, baseline, replicates=500)
    a, low, high = diff["a"]
    assert 0 < low < a < high and low < 0.05 < high and a == pytest.approx(0.05, abs=0.005)
    b, low, high = diff["b"]
    assert low < 0 < high and low < b < high  # the same B = 1.5 in both arms
    a, low, high = paired_difference(baseline, arm, replicates=500)["a"]
    assert low < a < high < 0
    with pytest.raises(UserError, match="same seeds"):
        paired_difference(arm, baseline[:4])


def test_plot_fits(tmp_path):
    curves = seeds(np.random.default_rng(4), 3, 0.8)
    flat = [(np.arange(1.0, 11.0), np.full(10, 0.3))]
    path = plot_fits({"arm": (curves, fit_pooled(curves)), "flat": (flat, fit_pooled(flat))}, tmp_path / "s.png",
                     xlabel="GPU-hours", ylabel="pass@1")  # fmt: skip
    assert path == tmp_path / "s.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_are_ordered_by_seed_as_numbers():
    from types import SimpleNamespace

    from rlx_cli.studies.scaling_report import seed_order

    runs = [SimpleNamespace(data=SimpleNamespace(tags={"rlx.seed": s})) for s in ("10", "2", "0", "1")]
    assert [r.data.tags["rlx.seed"] for r in sorted(runs, key=seed_order)] == ["0", "1", "2", "10"]
