"""``rlx report --x``: a run's curve against what it spent (samples, tokens, wall time) instead of its steps.

Arms do not spend the same per step (dynamic sampling draws more batches, SPO continues from cutpoints, RFT
samples once), so a table at the last step compares different budgets. On an axis other than ``step`` every run's
curve is cut at the common budget, the smallest final x of any run, its value there interpolated linearly between
the two points around it; the table's numbers and the area under the curve come from the cut curves.

A curve is ``[(step, value)]``; on an axis it becomes ``[(x, value)]`` by the run's own ``perf/<x>`` at each step
(``loops/compute.py`` logs them at every step and evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx_cli.config.errors import UserError

AXES = {"step": None, "samples": "perf/samples", "tokens": "perf/tokens", "wall": "perf/wall_s"}
UNITS = {"step": "steps", "samples": "answers sampled", "tokens": "tokens sampled", "wall": "seconds"}

Points = list[tuple[float, float]]  # a run's [(x, value)]; scaling_fit.Curve is (xs, ys)


def check_axis(x: str) -> None:
    if x not in AXES:
        raise UserError(f"--x {x} is not valid (valid: {', '.join(AXES)})")


def amount(x: float) -> str:
    """A budget as people write it: 1,280 samples, 3.5 s."""
    return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.3g}"


def on_axis(points: Points, spent: Points) -> Points:
    """``points`` [(step, value)] -> [(x, value)], x the run's ``spent`` [(step, x)] at that step; steps without
    an x are left out."""
    at = dict(spent)
    return [(at[step], value) for step, value in points if step in at]


def common_budget(curves: list[Points]) -> float:
    """The largest x every curve reaches: the smallest of their last x."""
    return min(curve[-1][0] for curve in curves if curve)


def cut(curve: Points, budget: float) -> Points:
    """``curve`` up to x = ``budget``, ending with its value at ``budget`` interpolated linearly between the points
    around it (a curve that ends before ``budget`` is returned whole)."""
    kept = [(x, v) for x, v in curve if x <= budget]
    after = next(((x, v) for x, v in curve if x > budget), None)
    if after is None or not kept or kept[-1][0] == budget:
        return kept
    (x0, v0), (x1, v1) = kept[-1], after
    return [*kept, (budget, v0 + (v1 - v0) * (budget - x0) / (x1 - x0))]


def area(curve: Points) -> float:
    """The normalised area under ``curve``: the trapezoid integral over its x range divided by that range, so in the
    metric's own units (the curve's mean height); a single point's value; NaN for none."""
    if not curve:
        return float("nan")
    if len(curve) == 1 or curve[-1][0] == curve[0][0]:
        return curve[-1][1]
    integral = sum((x1 - x0) * (v0 + v1) / 2 for (x0, v0), (x1, v1) in zip(curve, curve[1:]))
    return integral / (curve[-1][0] - curve[0][0])


@dataclass
class Axis:
    """A compute axis put on the curves: the common budget, the caption's words for it, and the table's extra
    columns (name -> legend), whose one-point curves the report added."""

    budget: float = float("nan")
    caption: str = ""
    columns: dict[str, str] = field(default_factory=dict)


def put_on_axis(arms: list, curves: dict, metric: str, extras: list[str], x: str) -> Axis:
    """``curves`` of the arms' runs in place on axis ``x``, cut at the common budget (``compute_axis``); adds the
    one-point curves of the AUC and of the samples each run drew in all -> the Axis."""
    runs = [r.info.run_id for a in arms for r in a.runs]
    samples = {run: curves.get((run, "perf/samples"), []) for run in runs}
    spent = arms_on_axis(arms, curves, [metric, *extras], x)
    budget = common_budget([curves[run, metric] for run in runs])
    starts = {run: curves[run, metric][0][0] for run in runs if curves[run, metric]}
    late = [a.label for a in arms if any(starts.get(r.info.run_id, budget) > budget for r in a.runs)]
    auc = f"AUC of {metric}"
    columns = {auc: f"the area under the run's {metric} curve over {x} (to the budget) divided by its {x} range: "
                    "the curve's mean height, mean ± sample std over seeds"}  # fmt: skip
    for run in runs:
        for name in [metric, *extras]:
            curves[run, name] = cut(curves[run, name], budget)
        curves[run, auc] = [(0, area(curves[run, metric]))]
    if all(samples.values()):
        columns["samples drawn"] = "answers each run sampled in all (perf/samples at its end), mean ± std over seeds"
        for run in runs:
            curves[run, "samples drawn"] = samples[run][-1:]
    caption = (
        f"at equal {UNITS[x]}: every run's curve cut at {x} = {amount(budget)}, the "
        "smallest budget any run reached, its value there interpolated"
        if spent
        else "AUC over steps"
    )
    if late:  # e.g. value pretraining's answers, drawn before the first evaluation
        caption += (
            f"; runs of {', '.join(late)} have no point before the budget (their first evaluation comes after "
            f"{x} = {amount(budget)}: what they sampled before RL counts), so no value: compare "
            "them with --x step"
        )
    return Axis(budget, caption, columns)


def arms_on_axis(arms: list, curves: dict, names: list[str], x: str) -> str | None:
    """The curves of ``names`` of the arms' runs, in place, from [(step, value)] to [(x, value)] -> the metric that
    gives x (None for steps); a UserError when a run did not log it."""
    spent, runs = AXES[x], [r.info.run_id for a in arms for r in a.runs]
    if spent is not None and any(not curves.get((run, spent)) for run in runs):
        raise UserError(
            f"--x {x}: some runs did not log {spent} (runs from before rlx logged compute; valid: --x step)"
        )
    for run in runs:
        for name in names:
            points = curves[run, name]
            curves[run, name] = on_axis(points, curves[run, spent]) if spent else points
    return spent
