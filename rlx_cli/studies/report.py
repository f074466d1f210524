"""``rlx report``: tracked runs -> an ablation table (one row per arm, mean ± std over seeds) and learning curves.

One pipeline, one ``Request`` carried through it:

1. **read** (``report_read``): the FINISHED runs of an experiment or a study from MLflow (any tracking URI) and its
   FAILED ones (for the health flags alone), grouped into arms, one ``RunRecord`` a run: its metric history reduced
   to one number (last | max | mean_last_k | mean_first_k), on a compute axis when asked; or, with ``--runs FILE``,
   the records a report wrote. A study declared in a plan brings what it was declared with.
2. **judge** (``report_table``): mean ± std per arm, Δ vs the baseline, eval SE and health; with ``--stats`` (or a
   plan) each arm's verdict (``stats``; a declared study look by look, ``sequential``); with ``--power Δ`` or
   ``--plan-seeds`` instead the seeds each arm needs.
3. **write** (``report_format``): md | csv | tex | html, the per-run data beside ``--out``, the curves (``--plots``).

``--fit entropy|sigmoid`` replaces stages 2–3 by a fit (``entropy_fit``, ``scaling_report``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from rlx_cli.config.errors import UserError
from rlx_cli.studies import compute_axis, report_format, report_plots, report_read, run_records, scaling_report, stats
from rlx_cli.studies.report_read import DEFAULT_METRIC, Read
from rlx_cli.studies.report_table import build_table, known_lower_is_better, plan_seeds_table, power_table
from rlx_cli.studies.run_records import RunRecord
from rlx_cli.studies.runs import load_runs

REDUCE = ("last", "max", "mean_last_k", "mean_first_k")
FITS = ("entropy", "sigmoid")  # rlx report --fit: entropy_fit.py, scaling_report.py
FORMATS = ("md", "csv", "tex", "html")
DIRECTIONS = ("higher", "lower")  # --higher-is-better, --lower-is-better; neither: lower for losses, KLs, times
# the metric of the table rlx sweep and rlx ablate print at their end: the accuracy of what the policy samples, which
# RL trains (the built-in bases answer greedily near 1.0 already); eval/accuracy where the runs lack it
MAIN_METRICS = ("eval/accuracy_sampled", "eval/accuracy")
STORE_OPTIONS = ("experiment", "study", "fit", "x", "plots")  # what --runs cannot take: they need MLflow


@dataclass(frozen=True)
class Request:
    """Everything ``rlx report`` was asked, as its options name it; None: not given (a plan's or the default)."""

    experiment: str | None = None
    study: str | None = None
    metric: str | None = None
    baseline: str | None = None
    reduce_by: str = "last"
    k: int = 3
    fmt: str = "md"
    out: Path | None = None
    plots: Path | None = None
    extras: tuple[str, ...] = ()
    with_stats: bool = False
    direction: str | None = None
    seeds: str | None = None
    arm_names: tuple[str, ...] = ()
    fit: str | None = None
    power: float | None = None
    x: str | None = None
    fit_from: float = 0.0
    runs: Path | None = None
    margin: float | None = None
    alpha: float | None = None
    plan_seeds: bool = False
    plan: Path | None = None  # with --runs: the declared study's plan file, which judges its table

    def judging(self, plan, metric: str) -> stats.Judging:
        """The margin, α and direction: the options, else the plan's, else the defaults (a metric known to be
        better lower is judged so)."""
        margin = self.margin if self.margin is not None else (plan.margin if plan else stats.Judging.margin)
        alpha = self.alpha if self.alpha is not None else (plan.alpha if plan else stats.ALPHA)
        direction = self.direction or (plan.direction if plan else None)
        lower = direction == "lower" if direction else known_lower_is_better(metric)
        return stats.Judging(margin, alpha, lower)


def report_command(*, extra_metrics: str | None = None, arm_names=None, **options) -> str:
    """``rlx report``: returns the formatted table (and writes it to ``out``, the per-run data beside it, the curves
    to ``plots``); the options are ``Request``'s, ``extra_metrics`` comma-separated."""
    extras = tuple(m.strip() for m in (extra_metrics or "").split(",") if m.strip())
    return run(Request(extras=extras, arm_names=tuple(arm_names or ()), **options))


def run(request: Request) -> str:
    check(request)
    if request.runs is not None:
        given = [name for name in STORE_OPTIONS if getattr(request, name) is not None]
        if given:
            raise UserError(f"--runs rebuilds the table from its file; --{given[0]} needs the MLflow store (valid: "
                            "--runs without it, or --experiment/--study without --runs)")  # fmt: skip
        read = report_read.from_file(request)
        if read.plan:
            check_against(request, read.plan)
        return written(tabulate(read, request).render(request.fmt), request.out)
    if request.plan is not None:
        raise UserError("--plan judges a --runs FILE; a study's own plan is read from the store (valid: --runs FILE "
                        "--plan PLAN, or --study NAME alone)")  # fmt: skip
    plan = report_read.declared(request.study)
    if plan:
        check_against(request, plan)
    metric = request.metric or (plan.metric if plan else DEFAULT_METRIC)
    if plan and not request.extras:
        request = replace(request, extras=tuple(m for m in [plan.metric, *plan.secondary] if m != metric))
    arms, base, known = report_read.select(request, metric, plan, with_failed=request.fit is None)
    if request.fit == "entropy":
        from rlx_cli.studies import entropy_fit

        return written(entropy_fit.fit_report(arms, metric, known, request.plots), request.out)
    if request.fit == "sigmoid":
        return sigmoid(request, metric, arms, base, known)
    read = report_read.from_store(request, metric, plan, arms, base, known)
    tabled = tabulate(read, request)
    text = written(tabled.render(request.fmt), request.out)
    data_and_plots(read, [metric, *request.extras], request)
    return text


def sigmoid(request: Request, metric: str, arms, base, known) -> str:
    """``--fit sigmoid``: ScaleRL's fit of each arm's curve over ``--x`` (``scaling_report``)."""
    axis = request.x or "step"
    read = report_read.from_store(replace(request, x=None, extras=()), metric, None, arms, base, known)
    compute_axis.arms_on_axis(arms, read.curves, [metric], axis)
    points = {r.info.run_id: read.curves[r.info.run_id, metric] for a in arms for r in a.runs}
    report = scaling_report.sigmoid_report(arms, base, points, metric, axis, request.fit_from, request.plots,
                                           request.out)  # fmt: skip
    text = written(report, request.out)
    read.context.axis = axis
    data_and_plots(read, [metric], request)
    return text


def study_report(study: str, folder: Path) -> tuple[str, list[Path]]:
    """The table ``rlx sweep`` and ``rlx ablate`` print at their end: what ``rlx report --study NAME --stats`` gives
    on the study's main metric (its plan's, or ``MAIN_METRICS``: the first its runs logged), also written to
    ``folder`` as ``table.md`` and ``table.csv`` with its per-run data (``table-runs.csv``, ``table-curves.csv``)
    -> (the Markdown, the paths written)."""
    plan = report_read.declared(study)
    logged = {m for r in load_runs(None, study) for m in r.data.metrics}
    metric = plan.metric if plan else next((m for m in MAIN_METRICS if m in logged), None)
    if metric is None or metric not in logged:
        raise UserError(f"study '{study}' logged none of {metric or ', '.join(MAIN_METRICS)} (rlx report --study "
                        f"{study} --metric NAME tabulates another)")  # fmt: skip
    request = Request(study=study, metric=metric, with_stats=True, out=folder / "table.md")
    arms, base, known = report_read.select(request, metric, plan, with_failed=True)
    read = report_read.from_store(request, metric, plan, arms, base, known)
    tabled = tabulate(read, request)
    text = written(tabled.render("md"), folder / "table.md")
    written(tabled.render("csv"), folder / "table.csv")
    return text, [folder / "table.md", folder / "table.csv", *per_run_data(read, [metric], folder / "table.md")]


def check(request: Request) -> None:
    if request.reduce_by not in REDUCE:
        raise UserError(f"--reduce {request.reduce_by} is not valid (valid: {', '.join(REDUCE)})")
    if request.fmt not in FORMATS:
        raise UserError(f"--format {request.fmt} is not valid (valid: {', '.join(FORMATS)})")
    if request.k < 1:
        raise UserError(f"--k {request.k} is not valid (valid: 1 or more)")
    if request.fit is not None and request.fit not in FITS:
        raise UserError(f"--fit {request.fit} is not valid (valid: {', '.join(FITS)})")
    scaling_report.check_fit_from(request.fit_from)
    if request.x is not None:
        compute_axis.check_axis(request.x)
    if request.power is not None and not request.power > 0:
        raise UserError(f"--power {request.power} is not valid (valid: the Δ to detect, > 0, in the metric's units, "
                        "e.g. 0.02)")  # fmt: skip
    if request.margin is not None and not request.margin > 0:
        raise UserError(f"--margin {request.margin} is not valid (valid: > 0, in the metric's units, e.g. 0.02)")
    if request.alpha is not None and not 0 < request.alpha < 0.5:
        raise UserError(f"--alpha {request.alpha} is not valid (valid: above 0 and below 0.5, e.g. 0.05: TOST's "
                        "one-sided tests need α < 0.5)")  # fmt: skip
    if request.direction not in (None, *DIRECTIONS):
        raise UserError(f"direction {request.direction} is not valid (valid: {', '.join(DIRECTIONS)})")


def check_against(request: Request, plan) -> None:
    """A declared study is judged as it was declared: an option that says otherwise is one line."""
    given = {"margin": request.margin, "alpha": request.alpha, "direction": request.direction}
    for key, value in given.items():
        if value is not None and value != getattr(plan, key):
            declared = getattr(plan, key)
            raise UserError(f"study '{plan.study}' was declared with {key} {declared!r}, not {value!r} (valid: "
                            f"no --{key}: the plan judges; or --runs FILE to judge its runs otherwise)")  # fmt: skip


@dataclass
class Tabled:
    """A table's numbers (``report_table``) and what its caption, legend and notes say; ``power``: a planning one."""

    frame: pd.DataFrame
    context: report_format.Context
    power: float | None = None
    planning: bool = False  # --plan-seeds

    def render(self, fmt: str) -> str:
        if self.planning:
            return report_format.render_plan_seeds(self.frame, self.context, fmt)
        if self.power is not None:
            return report_format.render_power(self.frame, self.context, self.power, fmt)
        return report_format.render(self.frame, self.context, fmt)


def tabulate(read: Read, request: Request) -> Tabled:
    """Stage 2: the ablation table of ``read`` judged as asked (or a planning table)."""
    context, plan = read.context, read.plan
    judging = request.judging(plan, context.metric)
    context.judging = judging
    labels = [(a.label, a.key) for a in read.arms]
    if request.plan_seeds:
        frame = plan_seeds_table(labels, read.base.label, read.records, judging, plan)
        return Tabled(frame, context, planning=True)
    if request.power is not None:
        frame = power_table(labels, read.base.label, read.records, request.power, judging)
        return Tabled(frame, context, request.power)
    asked = judging if (request.with_stats or plan) else None
    frame, context.notes = build_table(labels, read.base.label, read.records, context.extras, asked, plan)
    return Tabled(frame, context)


def data_and_plots(read: Read, metrics: list[str], request: Request) -> None:
    """The per-run data beside ``--out`` (``per_run_data``) and the curves of ``metrics`` in ``--plots``."""
    paths = per_run_data(read, metrics, request.out) if request.out is not None else []
    if request.plots is not None:
        paths += report_plots.plot_curves(read.arms, read.curves, metrics, request.plots, read.context.axis)
    for path in paths:
        print(f"wrote {path}", flush=True)


def per_run_data(read: Read, metrics: list[str], out: Path) -> list[Path]:
    """``<out stem>-runs.csv`` (``run_records``: a record per run) and ``<out stem>-curves.csv`` (arm, seed, run id,
    metric, x, value: every point the table and plots used) beside ``out``, so that a report's statistics can be
    recomputed without the MLflow store (``rlx report --runs``) -> their paths."""
    listed: list[RunRecord] = [r for runs in read.records.values() for r in runs]
    points = [
        {"arm": r.arm, "seed": r.seed, "run_id": r.run_id, "metric": name, "x": at, "value": value}
        for r in listed
        for name in metrics
        for at, value in read.curves.get((r.run_id, name), [])
    ]
    runs_path, curves_path = out.with_name(f"{out.stem}-runs.csv"), out.with_name(f"{out.stem}-curves.csv")
    run_records.write(listed, metrics[0], runs_path)
    pd.DataFrame(points, columns=["arm", "seed", "run_id", "metric", "x", "value"]).to_csv(curves_path, index=False)
    return [runs_path, curves_path]


def written(text: str, out: Path | None) -> str:
    """``text``, also written to ``out`` when given."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text
