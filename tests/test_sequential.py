"""A declared study decided look by look (rlx_cli/studies/sequential.py): calibration on synthetic per-seed data
(issue 60, acceptance 1) and the bookkeeping of looks, seeds and the no-op control."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_cli.studies import power, sequential, stats
from rlx_cli.studies.comparison import compare_rows
from rlx_cli.studies.study_plan import StudyPlan

DELTA = 0.02
ARMS = ["a0", "a1", "a2", "a3"]
PLAN = StudyPlan(study="s", arms={"base": [], **{a: [] for a in ARMS}}, baseline="base", margin=DELTA, seeds=5,
                 every=5, max_seeds=20, design="until_decided")  # fmt: skip
JUDGING = stats.Judging(margin=DELTA)


def studies(delta: float, sigma: float, count: int, seed: int):
    """``count`` studies of 4 arms at a true Δ against a baseline, per-seed sd of a difference ``sigma``: each arm's
    comparison at each look, tested for all studies at once -> found[arm][look][study]."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0.0, 0.05, (count, 20))
    base = 0.6 + shared + rng.normal(0.0, sigma / math.sqrt(2), (count, 20))
    arms = {a: 0.6 + delta + shared + rng.normal(0.0, sigma / math.sqrt(2), (count, 20)) for a in ARMS}
    looks = PLAN.looks
    return {a: [compare_rows(v[:, :n], base[:, :n], paired=True, margin=DELTA) for n in looks] for a, v in arms.items()}


def decided(found, i: int):
    """Study i, look by look as rlx decides it -> (verdicts at the last look, arm -> the look that decided it)."""
    verdicts, looks, _ = sequential.looked(lambda arm, k: found[arm][k][i], ARMS, PLAN, JUDGING)
    return verdicts, looks


def slack(rate: float, count: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / count)


def test_no_true_difference_keeps_the_family_wise_error_over_looks_and_arms():
    """1,000 studies, 4 arms, looks at 5, 10, 15, 20 seeds: a false better/worse anywhere in at most α of them; the
    same data judged afresh at every look (a naive second, third and fourth look) exceeds it."""
    count, found = 1000, studies(0.0, DELTA, 1000, seed=0)
    false = naive = 0
    for i in range(count):
        verdicts, _ = decided(found, i)
        false += any(v.label in ("better", "worse") for v in verdicts.values())
        looks = [stats.judge({a: (found[a][k][i], 0) for a in ARMS}, JUDGING) for k in range(len(PLAN.looks))]
        naive += any(v.label in ("better", "worse") for look in looks for v in look.values())
    assert false / count <= 0.05 + slack(0.05, count)
    assert naive / count > 0.05 + slack(0.05, count) and naive > 2 * false


@pytest.mark.parametrize(("delta", "sigma", "label"), [(2 * DELTA, DELTA, "better"), (0.0, DELTA / 3, "equivalent")])
def test_arms_are_decided_early_and_with_fewer_seeds_than_a_fixed_design(delta, sigma, label):
    """Δ = 2δ, sd δ: at least 80% of the arms are decided better before the last look; Δ = 0, sd δ/3: at least 80%
    decided equivalent. The mean seeds an arm runs against the fixed design whose power, at the family's first
    level α/4, matches the share the study decided (capped at 0.99)."""
    count, found = 400, studies(delta, sigma, 400, seed=1)
    early, right, used = 0, 0, []
    for i in range(count):
        verdicts, looks = decided(found, i)
        for arm in ARMS:
            right += verdicts[arm].label == label
            early += verdicts[arm].label == label and looks.get(arm, 3) < 3
            used.append(PLAN.looks[looks[arm]] if arm in looks else PLAN.looks[-1])
    arms = count * len(ARMS)
    assert early / arms >= 0.8
    target = min(0.99, right / arms)
    if label == "better":
        fixed = power.fewest(lambda n: power.power(delta, (sigma**2,), n, 0.05 / 4) >= target, 2)
        assert np.mean(used) < fixed  # 8.4 against 10 seeds
    else:  # the first look's 5 seeds are about what a fixed design needs here: no saving to make
        fixed = power.fewest(lambda n: power.power_equivalent(delta, (sigma**2,), n, DELTA, 0.05 / 4) >= target, 2)
        assert np.mean(used) <= fixed + 0.5  # 6.0 against 6 seeds


def plan_of(**changes) -> StudyPlan:
    fields = dict(study="s", arms={"base": [], "x": [], "y": [], "noop": []}, baseline="base", margin=0.02, seeds=2,
                  every=2, max_seeds=6, design="until_decided", control=True)  # fmt: skip
    return StudyPlan(**(fields | changes))


def test_a_replay_names_the_seeds_of_the_next_look_and_stops_decided_arms():
    plan = plan_of()
    base = {0: 0.50, 1: 0.60, 2: 0.55, 3: 0.52}
    values = {"base": base, "noop": dict(base), "x": {s: v - 0.3 for s, v in base.items()},
              "y": {0: 0.51, 1: 0.58}}  # fmt: skip
    first = sequential.replay({k: {s: v for s, v in d.items() if s < 2} for k, d in values.items()}, plan)
    assert first.looks_done == 1 and first.paired and first.arms["noop"].verdict.label == "identical"
    assert first.arms["noop"].look == 0 and not first.arms["noop"].running
    assert first.arms["y"].running and first.next_seeds == {"x": 4, "y": 4, "base": 4} or first.arms["x"].look == 0
    # look 2 needs y's seeds 2 and 3: not there yet, so the study waits at one look done
    waiting = sequential.replay(values, plan)
    assert waiting.looks_done == 1 and waiting.next_seeds["y"] == 4
    nothing = sequential.replay({}, plan)
    assert nothing.looks_done == 0 and nothing.next_seeds == {"base": 2, "x": 2, "y": 2, "noop": 2}


def test_a_chaotic_control_judges_every_arm_unpaired():
    plan = plan_of(seeds=5, max_seeds=10, every=5)
    rng = np.random.default_rng(2)
    base = dict(enumerate(rng.uniform(0.3, 0.9, 5)))
    noop = dict(enumerate(rng.uniform(0.3, 0.9, 5)))  # the same update up to rounding, ending anywhere: chaos
    values = {"base": base, "noop": noop, "x": dict(base), "y": {s: v + 0.001 for s, v in base.items()}}
    found = sequential.replay(values, plan)
    assert not found.paired and found.control_sd > 0.1
    assert found.arms["y"].verdict.comparison.test == "Welch"
    calm = sequential.replay(values | {"noop": dict(base)}, plan)
    assert calm.paired and calm.arms["y"].verdict.comparison.test == "paired"


def test_the_expected_seeds_of_a_design():
    plan = plan_of(seeds=5, every=5, max_seeds=20)
    mean, share = sequential.expected_seeds(2 * DELTA, DELTA, plan, 4, studies=200)
    assert 5 <= mean < 12 and share > 0.95
    slow, _ = sequential.expected_seeds(0.005, 4 * DELTA, plan, 4, studies=200)
    assert slow > mean
