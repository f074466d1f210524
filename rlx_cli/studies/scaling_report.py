"""``rlx report --fit sigmoid``: ScaleRL's compute-scaling curve per arm, with intervals across seeds.

Per arm: R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted to its runs pooled (``scaling_fit``) on the chosen
metric and axis; A, B, C_mid, R0 with percentile-bootstrap intervals over seeds; A and B against the baseline, paired
by seed; and the extrapolation check: fitted on the first half of the budget, the error of its prediction of the last
point. A run's points at x ≤ 0 (step 0 on a compute axis) are its start: their mean is R0 and they are not fitted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rlx_cli.config.errors import UserError
from rlx_cli.studies import scaling_fit
from rlx_cli.studies.report_format import num, signed

REPLICATES = 1000


def start_and_rest(curve: list[tuple[float, float]]) -> tuple[float | None, tuple[list, list]]:
    """A run's curve [(x, value)] -> (the mean value at x ≤ 0 or None, its (x, value) at x > 0)."""
    start = [v for x, v in curve if x <= 0]
    rest = [(x, v) for x, v in curve if x > 0]
    return (sum(start) / len(start) if start else None), ([x for x, _ in rest], [v for _, v in rest])


def seed_order(run) -> tuple[int, str]:
    """A run's place by seed, numbers as numbers (2 before 10)."""
    seed = run.data.tags.get("rlx.seed", "")
    return (int(seed), "") if seed.isdigit() else (2**63, seed)


def fitted_arm(runs: list, curves: dict, fit_from: float):
    """-> (R0 or None, [(x, values)] of the runs in seed order, the seeds)."""
    ordered = sorted(runs, key=seed_order)
    parts = [start_and_rest(curves[r.info.run_id]) for r in ordered]
    starts = [s for s, _ in parts if s is not None]
    r0 = sum(starts) / len(starts) if starts and fit_from <= 0 else None
    return r0, [rest for _, rest in parts], [r.data.tags.get("rlx.seed", r.info.run_id) for r in ordered]


def interval(low_high) -> str:
    low, high = low_high
    return "–" if math.isnan(low) else f"[{num(low)}, {num(high)}]"


def sigmoid_report(arms, base, curves: dict, metric: str, axis: str, fit_from: float, plots, out) -> str:
    """``curves``: run id -> [(x, value)] of ``metric`` on ``axis`` -> the markdown table; per-run fits beside
    ``out`` (``<stem>-fits.csv``) and the points and fits in ``plots`` (``fit-sigmoid.png``)."""
    r0_base, base_runs, base_seeds = fitted_arm(base.runs, curves, fit_from)
    rows, drawn, per_run = [], {}, []
    for arm in [base, *(a for a in arms if a is not base)]:
        r0, runs, seeds = fitted_arm(arm.runs, curves, fit_from)
        fit = scaling_fit.fit_pooled(runs, fit_from=fit_from, r0=r0)
        drawn[arm.label] = (runs, fit)
        for seed, run in zip(seeds, runs):
            one = scaling_fit.fit_sigmoid(*run, fit_from=fit_from, r0=r0)
            per_run.append({"arm": arm.label, "seed": seed, **vars(one)})
        nan = (math.nan, math.nan)
        bounds = scaling_fit.bootstrap(runs, replicates=REPLICATES, fit_from=fit_from, r0=r0) if len(runs) > 1 else {}
        try:
            predicted, observed, error = scaling_fit.extrapolation_error(runs, fit_from=fit_from, r0=r0)
        except UserError:  # fewer than 4 points in the first half of the budget
            predicted, observed, error = math.nan, math.nan, math.nan
        cells = [arm.label, str(len(runs)), *(f"{num(getattr(fit, p))} {interval(bounds.get(p, nan))}"
                                               for p in ("a", "b", "c_mid")), num(fit.r0)]  # fmt: skip
        shared = [s for s in seeds if s in base_seeds]
        if arm is base or len(shared) < 2:
            cells += ["baseline" if arm is base else "–", "–"]
        else:
            mine = [runs[seeds.index(s)] for s in shared]
            theirs = [base_runs[base_seeds.index(s)] for s in shared]
            diff = scaling_fit.paired_difference(
                mine, theirs, replicates=REPLICATES, fit_from=fit_from, r0=r0, base_r0=r0_base
            )
            cells += [f"{signed(d)} [{signed(lo)}, {signed(hi)}]" for d, lo, hi in (diff["a"], diff["b"])]
        cells += [num(predicted), num(observed), num(error)]
        rows.append(cells)
    if out is not None:
        path = Path(out).with_name(f"{Path(out).stem}-fits.csv")
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(per_run).to_csv(path, index=False)
        print(f"wrote {path}", flush=True)
    if plots is not None:
        path = scaling_fit.plot_fits(drawn, Path(plots) / "fit-sigmoid.png", xlabel=axis, ylabel=metric)
        print(f"wrote {path}", flush=True)
    headers = ["arm", "runs", "A [95% CI]", "B [95% CI]", "C_mid [95% CI]", "R0", f"ΔA vs {base.label} [95% CI]",
               "ΔB [95% CI]", "extrapolated", "observed", "error"]  # fmt: skip
    align = ["left"] + ["right"] * (len(headers) - 1)
    table = pd.DataFrame(rows, columns=headers).to_markdown(index=False, disable_numparse=True, colalign=align)
    start = f"x ≥ {fit_from:g}" if fit_from > 0 else "x > 0, R0 the runs' mean at x = 0"
    return (
        f"R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), R = {metric}, C = {axis}, fitted to each arm's runs pooled "
        f"({start}; ScaleRL, arXiv 2510.13786)\n\n{table}\n\nColumns:\n\n"
        "- A: the fitted asymptote; B: the efficiency (steepness); C_mid: the compute at half the gain; intervals: "
        f"percentile bootstrap over seeds ({REPLICATES} resamples, Hesterberg's expanded percentiles)\n"
        "- ΔA, ΔB: the arm's minus the baseline's, the seeds both ran resampled together\n"
        "- extrapolated, observed, error: fitted on the first half of the budget (x ≤ half the largest), the "
        "prediction of the runs' last point, the mean of those points, and |difference|: a large error says the "
        "fit's A cannot be trusted on this study\n"
    )


def check_fit_from(fit_from: float) -> None:
    if not np.isfinite(fit_from) or fit_from < 0:
        raise UserError(f"--fit-from {fit_from} is not valid (valid: 0 or more, in the units of --x)")
