"""A declared study judged look by look: which arms are decided, at which look, and which get more seeds.

At look k every arm still undecided, and the baseline, have run seeds 0 … n_k − 1; the family (``stats.judge``) is
judged with each arm's latest look, an arm decided earlier keeping the look it was decided at. An arm is decided
once it is ``better``, ``worse``, ``equivalent`` or ``identical``; it then gets no more seeds, and the undecided ones
get ``every`` more, up to ``max_seeds``, where what is left is ``inconclusive`` at that many seeds. Boundaries
(``boundaries.nominal``) spend α over the looks, so the family-wise error holds over every look and arm.

The no-op control (``study_plan.CONTROL``) computes the baseline's update up to float rounding. At the first look its
paired comparison with the baseline, judged alone, must be ``identical`` or ``equivalent``; when it is not, the
regime is chaotic at the seed level (two runs that differ by rounding end apart), pairing by seed buys nothing, and
every arm is judged unpaired (Welch's test) at every look. The choice reads the control alone, once.

``replay`` is a pure function of the per-seed values: a study that is resumed, or judged again by ``rlx report``,
comes to the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from rlx_cli.studies import stats
from rlx_cli.studies.comparison import Comparison, compare, compare_rows
from rlx_cli.studies.study_plan import CONTROL, StudyPlan

NAN = float("nan")
DECIDED = ("better", "worse", "equivalent", "identical")


@dataclass(frozen=True)
class ArmState:
    verdict: stats.Verdict
    look: int | None  # the index of the look that decided it; None while undecided
    seeds: int  # the seeds its verdict rests on
    running: bool  # it runs more seeds at the next look


@dataclass(frozen=True)
class Replay:
    arms: dict[str, ArmState]  # every arm but the baseline, in the plan's order
    looks_done: int  # complete looks
    paired: bool
    control_sd: float  # the no-op control's per-seed sd of its difference from the baseline (NaN without one)
    next_seeds: dict[str, int]  # arm -> the seeds it must have run for the next look (the baseline too); {} at the end

    @property
    def finished(self) -> bool:
        return not self.next_seeds


def judging_of(plan: StudyPlan, lower_is_better: bool) -> stats.Judging:
    return stats.Judging(plan.margin, plan.alpha, lower_is_better, plan.spending)


def first(values: Mapping[int, float], n: int) -> dict[int, float]:
    return {s: values[s] for s in range(n)}


def comparison(arm: Mapping[int, float], base: Mapping[int, float], n: int, *, paired: bool, margin: float):
    """The arm's first ``n`` seeds against the baseline's: paired by seed, or as independent samples."""
    a, b = first(arm, n), first(base, n)
    if paired:
        return compare({str(s): v for s, v in a.items()}, {str(s): v for s, v in b.items()}, margin=margin)
    return compare({f"a{s}": v for s, v in a.items()}, {f"b{s}": v for s, v in b.items()}, margin=margin)


def has(values: Mapping[int, float], n: int) -> bool:
    return all(s in values for s in range(n))


def looked(at: Callable[[str, int], Comparison | None], arms: list[str], plan: StudyPlan,
           judging: stats.Judging) -> tuple[dict[str, stats.Verdict], dict[str, int], int]:  # fmt: skip
    """The looks in order: ``at(arm, k)`` is the arm's comparison with the baseline at look k (None when look k is
    not complete) -> (the verdicts of the last complete look, arm -> the look that decided it, looks complete)."""
    rejected: dict[tuple[str, str], float] = {}
    decided: dict[str, int] = {}
    verdicts: dict[str, stats.Verdict] = {}
    done = 0
    for k in range(len(plan.looks)):
        running = [a for a in arms if a not in decided]
        now = {a: at(a, k) for a in running}
        if not running or any(c is None for c in now.values()):
            break
        latest = {a: (now[a], k) if a in now else (at(a, decided[a]), decided[a]) for a in arms}
        verdicts = stats.judge(latest, judging, plan.fractions, rejected)
        decided |= {a: k for a in running if verdicts[a].label in DECIDED}
        done = k + 1
    return verdicts, decided, done


def replay(values: Mapping[str, Mapping[int, float]], plan: StudyPlan, *, lower_is_better: bool = False) -> Replay:
    """``values``: arm name -> {seed: the metric, reduced} of its FINISHED runs -> the study's state."""
    looks, judging = plan.looks, judging_of(plan, lower_is_better)
    others = [a for a in plan.arms if a != plan.baseline]
    base = values.get(plan.baseline, {})
    paired, control_sd = True, NAN
    noop = values.get(CONTROL[0], {})
    if plan.control and has(noop, looks[0]) and has(base, looks[0]):
        control = comparison(noop, base, looks[0], paired=True, margin=plan.margin)
        control_sd = control.sigma if control.test else NAN
        paired = stats.judge({"noop": (control, 0)}, judging)["noop"].label in ("identical", "equivalent")

    def at(arm: str, k: int) -> Comparison | None:
        arm_values, n = values.get(arm, {}), looks[k]
        if not (has(arm_values, n) and has(base, n)):
            return None
        return comparison(arm_values, base, n, paired=paired, margin=plan.margin)

    verdicts, decided, done = looked(at, others, plan, judging)
    states = {}
    for arm in others:
        look = decided.get(arm)
        seeds = looks[look] if look is not None else (looks[done - 1] if done else 0)
        empty = stats.Verdict("inconclusive", NAN, NAN, NAN, None)
        states[arm] = ArmState(verdicts.get(arm, empty), look, seeds, look is None and done < len(looks))
    need = looks[done] if done < len(looks) else None
    going = [a for a, s in states.items() if s.running]
    next_seeds = {a: need for a in [plan.baseline, *going]} if need and going else {}
    return Replay(states, done, paired, control_sd, next_seeds)


def expected_seeds(delta: float, sigma: float, plan: StudyPlan, arms: int, *, studies: int = 400,
                   seed: int = 0) -> tuple[float, float]:  # fmt: skip
    """Simulated: the mean seeds an arm whose true effect is ``delta`` (per-seed sd of its difference ``sigma``)
    runs under ``plan``'s looks, judged at α / ``arms`` (the family's first step), and the share of studies that
    decide it -> (mean seeds, share decided)."""
    if math.isnan(sigma) or sigma == 0:
        return NAN, NAN
    rng, looks = np.random.default_rng(seed), plan.looks
    diffs = rng.normal(delta, sigma, (studies, looks[-1]))
    found = [compare_rows(diffs[:, :n], np.zeros((studies, n)), paired=True, margin=plan.margin) for n in looks]
    judging = stats.Judging(plan.margin, plan.alpha / max(1, arms), spending=plan.spending)
    used, hits = [], 0
    for i in range(studies):
        _, decided, _ = looked(lambda arm, k: found[k][i], ["arm"], plan, judging)  # noqa: B023
        used.append(looks[decided["arm"]] if "arm" in decided else looks[-1])
        hits += "arm" in decided
    return float(np.mean(used)), hits / studies
