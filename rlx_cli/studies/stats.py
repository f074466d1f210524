"""Verdicts: each arm of a table against the baseline, better / worse / equivalent / identical / inconclusive, with
the error of the whole table held at α.

- **Two hypotheses an arm**: D, Δ = 0 (the t-test of ``comparison``; rejected: ``better`` or ``worse``) and E,
  |Δ| >= δ (TOST; rejected: ``equivalent``). Both rejected: ``better``/``worse`` "within δ", a difference too small
  to act on. Δ = 0 with no spread at all is ``identical`` (no test: the arms computed the same numbers); a spread
  below float rounding with Δ ≠ 0 gives no p, so no verdict.
- **One family**: the table's 2m hypotheses are tested by Holm's step-down with Shaffer's logical restriction
  (Shaffer 1986): Δ = 0 and |Δ| >= δ exclude each other, so at most one null an arm is true, and each step tests at
  α / t, t the arms with a hypothesis not yet rejected. When a true null is first rejected, all true nulls are
  still unrejected, one an arm at most, so t is at least their number and Bonferroni over them bounds the chance
  at α, whatever the tests' dependence.
- **Looks**: in a study judged at several looks (``fractions``: the seeds at each look over the most), each hypothesis
  is a group-sequential test (``boundaries.nominal``: Lan-DeMets spending, Pocock-type by default; D two-sided as two
  one-sided tests at half its level, E as TOST's two one-sided tests); a step that raises a level tests the arm's
  latest look against the boundary of the raised level, Holm's step in the graphical form of Maurer & Bretz (2013).
  The first true null rejected is rejected at some look at α/t with t at least the number of true nulls, so it
  crossed the boundary of a group-sequential test at level α/(true nulls) of its own, and those tests spend α.
  A single look at fraction 1 is the fixed design: thresholds are the levels themselves.
- **The interval beside a label is the one that decided it**: ``better``/``worse`` the two-sided interval at the
  level D was rejected at (1 − α/t in a fixed table), which leaves out 0; ``equivalent`` TOST's 1 − 2α/t interval,
  inside ±δ; ``inconclusive`` the two-sided interval at the level the step-down stopped at, which holds 0.
- **Seeds to decide** (fixed design, an inconclusive arm): ``power.seeds_to_decide`` at the level the step-down
  stopped at, always more than the seeds run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rlx_cli.studies import boundaries, power
from rlx_cli.studies.comparison import NAN, Comparison, of_values

ALPHA = 0.05
LABELS = ("better", "worse", "equivalent", "identical", "inconclusive")
FIXED = (1.0,)  # the information fractions of a table judged once
DIFFERENCE, EQUIVALENCE = "D", "E"


@dataclass(frozen=True)
class Judging:
    """How arms are judged: at family-wise level ``alpha`` against a ``margin`` δ in the metric's units."""

    margin: float = 0.02
    alpha: float = ALPHA
    lower_is_better: bool = False
    spending: str = "pocock"  # how a study judged at several looks spends α over them (boundaries.SPENDING)

    def __post_init__(self):
        if not 0 < self.alpha < 0.5:  # TOST's one-sided tests at α and 1 − 2α intervals need α < 0.5
            raise ValueError(f"alpha {self.alpha} is not valid (valid: above 0 and below 0.5, e.g. 0.05)")
        if not self.margin > 0:
            raise ValueError(f"margin {self.margin} is not valid (valid: > 0, in the metric's units, e.g. 0.02)")


@dataclass(frozen=True)
class Verdict:
    """One arm against the baseline: its ``label`` (one of ``LABELS``), Δ = mean(arm) - mean(base), the t-test's
    two-sided p, TOST's p (the larger one-sided p) and both adjusted for the table (fixed design); an inconclusive
    arm's ``seeds_needed`` or, without one, ``why``; ``within``: better or worse by less than δ. ``low``, ``high``:
    the interval of Δ that decided the label, at confidence ``level``."""

    label: str
    delta: float
    p: float
    p_equivalent: float
    seeds_needed: int | None
    level: float = NAN
    p_adjusted: float = NAN
    p_equivalent_adjusted: float = NAN
    within: bool = False
    why: str = ""
    judged_at: float = NAN  # the level D was judged at (α / t): rejected at, or where the step-down stopped
    comparison: Comparison | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def interval(self) -> tuple[float, float]:
        return self.comparison.interval(self.level) if self.comparison else (NAN, NAN)

    @property
    def low(self) -> float:
        return self.interval[0]

    @property
    def high(self) -> float:
        return self.interval[1]


def one_sided(kind: str, level: float, look: int, fractions: tuple[float, ...], spending: str = "pocock") -> float:
    """The one-sided threshold π of hypothesis ``kind`` at overall ``level`` at look ``look``: D is two one-sided
    tests at level/2 (its two-sided p is held to 2π), E is TOST's two at level (its p, the larger, to π). The
    interval that matches is the two-sided 1 − 2π one."""
    return boundaries.nominal(level / 2 if kind == DIFFERENCE else level, fractions, spending)[look]


def threshold(kind: str, level: float, look: int, fractions: tuple[float, ...], spending: str = "pocock") -> float:
    """The p below which hypothesis ``kind`` is rejected."""
    return (2 if kind == DIFFERENCE else 1) * one_sided(kind, level, look, fractions, spending)


def p_of(comparison: Comparison, kind: str) -> float:
    return comparison.p if kind == DIFFERENCE else comparison.p_equivalent


def step_down(latest: Mapping[str, tuple[Comparison, int]], judging: Judging, fractions: tuple[float, ...],
              rejected: dict[tuple[str, str], float]) -> float:  # fmt: skip
    """Holm-Shaffer over the arms' hypotheses, ``latest``: arm -> (its comparison at its latest look, that look's
    index). ``rejected`` ((arm, kind) -> the level it fell at) grows in place -> the level the procedure stopped at
    (NaN when every hypothesis fell)."""
    tested = {arm: c for arm, (c, _) in latest.items() if c.testable}
    while True:
        live = [arm for arm in tested if any((arm, k) not in rejected for k in (DIFFERENCE, EQUIVALENCE))]
        if not live:
            return NAN
        level = judging.alpha / len(live)
        fallen = [
            (arm, kind) for arm in live for kind in (DIFFERENCE, EQUIVALENCE)
            if (arm, kind) not in rejected
            and p_of(tested[arm], kind) < threshold(kind, level, latest[arm][1], fractions, judging.spending)
        ]  # fmt: skip
        if not fallen:
            return level
        rejected.update(dict.fromkeys(fallen, level))


def adjusted(ps: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Holm-Shaffer adjusted p-values of a fixed table (the smallest α at which the step-down rejects each): the
    j-th smallest p times t_j, the arms with a hypothesis ranked j or later, never decreasing; NaN stays NaN."""
    ranked = sorted((p, h) for h, p in ps.items() if not math.isnan(p))
    out, running = dict.fromkeys(ps, NAN), 0.0
    for j, (p, hypothesis) in enumerate(ranked):
        arms_left = len({arm for _, (arm, _) in ranked[j:]})
        running = max(running, min(1.0, arms_left * p))
        out[hypothesis] = running
    return out


def judge(latest: Mapping[str, tuple[Comparison, int]], judging: Judging, fractions: tuple[float, ...] = FIXED,
          rejected: dict[tuple[str, str], float] | None = None) -> dict[str, Verdict]:  # fmt: skip
    """The family's verdicts: ``latest`` arm -> (comparison, index of its latest look in ``fractions``); ``rejected``
    the hypotheses earlier looks rejected (grown in place). A fixed table (one look) also gets the adjusted p-values
    and, for an inconclusive arm, the seeds that would decide it."""
    rejected = {} if rejected is None else rejected
    stop = step_down(latest, judging, fractions, rejected)
    fixed = fractions == FIXED
    if any(c.margin != judging.margin for c, _ in latest.values()):
        raise ValueError(f"comparisons against another margin than {judging.margin} (valid: compare(..., margin=δ))")
    ps = {(arm, k): p_of(c, k) for arm, (c, _) in latest.items() for k in (DIFFERENCE, EQUIVALENCE)}
    adjusted_ps = adjusted(ps) if fixed else dict.fromkeys(ps, NAN)
    out = {}
    for arm, (comparison, look) in latest.items():
        fell = {k: rejected.get((arm, k)) for k in (DIFFERENCE, EQUIVALENCE)}
        label, interval_kind, level = "inconclusive", DIFFERENCE, stop
        if comparison.identical:
            label = "identical"
        elif fell[DIFFERENCE] is not None:
            label = "better" if (comparison.delta > 0) != judging.lower_is_better else "worse"
            level = fell[DIFFERENCE]
        elif fell[EQUIVALENCE] is not None:
            label, interval_kind, level = "equivalent", EQUIVALENCE, fell[EQUIVALENCE]
        confidence = NAN
        if comparison.testable and not math.isnan(level):
            confidence = 1 - 2 * one_sided(interval_kind, level, look, fractions, judging.spending)
        needed, why = None, ""
        if label == "inconclusive":
            needed, why = plan(comparison, judging, stop) if fixed else (None, "")
        out[arm] = Verdict(
            label, comparison.delta, ps[arm, DIFFERENCE], ps[arm, EQUIVALENCE], needed, confidence,
            adjusted_ps[arm, DIFFERENCE], adjusted_ps[arm, EQUIVALENCE],
            within=label in ("better", "worse") and fell[EQUIVALENCE] is not None, why=why,
            judged_at=stop if fell[DIFFERENCE] is None else fell[DIFFERENCE], comparison=comparison,
        )  # fmt: skip
    return out


def plan(comparison: Comparison, judging: Judging, level: float) -> tuple[int | None, str]:
    """An inconclusive arm's seeds to decide at the level its row was judged at, or what holds it back."""
    if not comparison.test:
        return None, "fewer than two seeds on a side: no test"
    if comparison.tied:
        return None, "no spread between seeds: no test (its seeds differ by the same amount, or not at all)"
    needed = power.seeds_to_decide(comparison.delta, comparison.variances, comparison.n, comparison.df,
                                   margin=judging.margin, level=level)  # fmt: skip
    return needed, "" if needed else f"more than {power.MOST} seeds at this spread"


def verdict(a: Sequence[float], b: Sequence[float], *, margin: float, alpha: float = ALPHA, paired: bool = True,
            lower_is_better: bool = False) -> Verdict:  # fmt: skip
    """The verdict on an arm's per-seed values ``a`` against the baseline's ``b`` (in seed order) at level
    ``alpha``, ``margin`` δ in the metric's units: the paired t-test (``paired``; a and b equally long) or Welch's,
    TOST against ±δ, one comparison judged alone (a table judges its arms together: ``judge``)."""
    judging = Judging(margin, alpha, lower_is_better)
    return judge({"arm": (of_values(a, b, paired=paired, margin=margin), 0)}, judging)["arm"]
