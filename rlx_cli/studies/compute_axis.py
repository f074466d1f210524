"""``rlx report --x``: a run's curve against what it spent (samples, tokens, wall time) instead of its steps.

Arms do not spend the same per step (dynamic sampling draws more batches, SPO continues from cutpoints, RFT
samples once), so a table at the last step compares different budgets. On an axis other than ``step`` every run's
curve is cut at the common budget, the smallest final x of any run, its value there interpolated linearly between
the two points around it; the table's numbers and the area under the curve come from the cut curves.

A curve is ``[(step, value)]``; on an axis it becomes ``[(x, value)]`` by the run's own ``perf/<x>`` at each step
(``loops/compute.py`` logs them at every step and evaluation).
"""

from __future__ import annotations

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
