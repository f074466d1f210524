"""``rlx report``: tracked runs -> an ablation table (one row per arm, mean ± std over seeds) and learning curves.

1. read the FINISHED runs of an experiment or a study from MLflow (any tracking URI), without study parents, and
   its FAILED ones (for the health flags alone); or, with ``--runs FILE``, the per-run records a report wrote
2. group them into arms by their overrides minus ``seed=`` (the latest run per seed counts)
3. a record per run (``run_records``): its metric history reduced to one number (last | max | mean_last_k |
   mean_first_k), the evaluation's standard error reduced alike, the figures the health flags read (``health``)
4. the table (``report_table``): mean ± std per arm, Δ vs the baseline (default: the first arm without an
   ablation), the eval SE and health columns; with ``--stats`` per arm the paired or Welch t-test, its CI, p,
   Holm's p across the table, the detectable effect and the verdict (``stats``); with ``--power Δ`` instead the
   seeds each arm needs to detect Δ
5. format (md | csv | tex | html, see ``report_format``) and optionally plot the curves
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from rlx_cli.config.errors import UserError
from rlx_cli.studies import compute_axis, health, report_format, run_records, scaling_report, stats
from rlx_cli.studies.arms import Arm, common_overrides, default_baseline, group_arms, only_arms, pick_arm
from rlx_cli.studies.report_table import build_table, known_lower_is_better, power_table
from rlx_cli.studies.run_records import RunRecord, reduced, se_metric
from rlx_cli.studies.runs import connect, histories, load_failed, load_runs, only_seeds, seeds_of
from rlx_cli.studies.stats import Judging
from rlx_cli.studies.study import override_tokens

REDUCE = ("last", "max", "mean_last_k", "mean_first_k")
FITS = ("entropy", "sigmoid")  # rlx report --fit: entropy_fit.py, scaling_report.py
FORMATS = ("md", "csv", "tex", "html")
DEFAULT_METRIC = "eval/accuracy"
# the metric of the table rlx sweep and rlx ablate print at their end: the accuracy of what the policy samples, which
# RL trains (the built-in bases answer greedily near 1.0 already); eval/accuracy where the runs lack it
MAIN_METRICS = ("eval/accuracy_sampled", "eval/accuracy")
DIRECTIONS = ("higher", "lower")  # --higher-is-better, --lower-is-better; neither: lower for losses, KLs, times
STORE_OPTIONS = ("--experiment", "--study", "--fit", "--x", "--plots")  # what --runs cannot take: they need MLflow


@dataclass(frozen=True)
class Asked:
    """What a table shows beyond the means: with ``stats`` each arm's tests and verdict, judged by ``judging``; with
    ``power`` instead the seeds each arm needs to detect that Δ."""

    judging: Judging = field(default_factory=Judging)
    stats: bool = False
    power: float | None = None
    direction: str | None = None  # "lower" | "higher" | None: by the metric's name


def report_command(
    *,
    experiment: str | None = None,
    study: str | None = None,
    metric: str | None = None,
    baseline: str | None = None,
    reduce_by: str = "last",
    k: int = 3,
    fmt: str = "md",
    out: Path | None = None,
    plots: Path | None = None,
    extra_metrics: str | None = None,
    with_stats: bool = False,
    direction: str | None = None,
    seeds: str | None = None,
    arm_names: list[str] | None = None,
    fit: str | None = None,
    power: float | None = None,
    x: str | None = None,
    fit_from: float = 0.0,
    runs: Path | None = None,
    margin: float = 0.02,
    alpha: float = stats.ALPHA,
) -> str:
    """``rlx report``: returns the formatted table (and writes it to ``out``, the per-run data beside it, the curves
    to ``plots``).

    ``metric``: the table's (default ``eval/accuracy``; with ``runs``, the file's). ``x``: the curves' axis, ``step``
    or a compute axis (``compute_axis.py``): every run cut at the common budget, an AUC column and the realised
    samples. ``fit="entropy"``: instead, per arm the fit of R = −a·exp(H) + b to (train/entropy, ``metric``)
    (``entropy_fit.py``). ``power``: instead, the seeds each arm needs to detect a Δ of that size (planning).
    ``with_stats``: the tests and each arm's verdict at level ``alpha`` against ``margin`` (in the metric's units),
    in the ``direction`` "lower" or "higher" is better, by default as the metric's name says (``DIRECTIONS``).
    ``runs``: the table rebuilt from the ``*-runs.csv`` a report wrote (``run_records``), without the MLflow store.
    """
    from rlx_cli.studies import entropy_fit

    check_options(reduce_by, fmt, k, fit, fit_from, x, power, margin, alpha, direction)
    extras = [m.strip() for m in (extra_metrics or "").split(",") if m.strip()]
    asked = Asked(Judging(margin, alpha), with_stats, power, direction)
    if runs is not None:
        given = dict(zip(STORE_OPTIONS, (experiment, study, fit, x, plots)))
        needs_store = next((option for option, value in given.items() if value is not None), None)
        if needs_store:
            raise UserError(f"--runs rebuilds the table from its file; {needs_store} needs the MLflow store (valid: "
                            "--runs without it, or --experiment/--study without --runs)")  # fmt: skip
        return written(
            from_file(runs, metric, extras, reduce_by, k, baseline, arm_names, seeds, asked).render(fmt), out
        )
    metric = metric or DEFAULT_METRIC
    arms, base, known = selected(experiment, study, metric, extras, seeds, arm_names, baseline, with_failed=fit is None)
    if fit == "entropy":
        return written(entropy_fit.fit_report(arms, metric, known, plots), out)
    _, client = connect()
    spent = [m for m in ("perf/samples", compute_axis.AXES.get(x)) if m in known]  # absent from older runs
    curves = histories(client, [r for a in arms for r in a.runs], [metric, *extras, *spent])
    if fit == "sigmoid":
        on_axis(arms, curves, [metric], x or "step")
        points = {r.info.run_id: curves[r.info.run_id, metric] for a in arms for r in a.runs}
        text = written(
            scaling_report.sigmoid_report(arms, base, points, metric, x or "step", fit_from, plots, out), out
        )
        records = records_of(arms, curves, {}, metric, [], reduce_by, k)
        data_and_plots(records, arms, curves, [metric], out, plots, x or "step")
        return text
    source = " · ".join(f"{k_} {v}" for k_, v in (("experiment", experiment), ("study", study)) if v)
    tabled, records = on_store(arms, base, known, client, curves, metric, extras, reduce_by, k, x, source, asked)
    text = written(tabled.render(fmt), out)
    data_and_plots(records, arms, curves, [metric, *extras], out, plots, tabled.context.axis)
    return text


def study_report(study: str, folder: Path) -> tuple[str, list[Path]]:
    """The table ``rlx sweep`` and ``rlx ablate`` print at their end: what ``rlx report --study NAME --stats`` gives
    on the study's main metric (``MAIN_METRICS``: the first its runs logged), also written to ``folder`` as
    ``table.md`` and ``table.csv`` with its per-run data (``table-runs.csv``, ``table-curves.csv``) -> (the
    Markdown, the paths written)."""
    logged = {m for r in load_runs(None, study) for m in r.data.metrics}
    metric = next((m for m in MAIN_METRICS if m in logged), None)
    if metric is None:
        raise UserError(f"study '{study}' logged none of {', '.join(MAIN_METRICS)} (rlx report --study {study} "
                        "--metric NAME tabulates another)")  # fmt: skip
    arms, base, known = selected(None, study, metric, [], None, None, None, with_failed=True)
    _, client = connect()
    curves = histories(client, [r for a in arms for r in a.runs], [metric])
    tabled, records = on_store(arms, base, known, client, curves, metric, [], "last", 1, None, f"study {study}",
                               Asked(stats=True))  # fmt: skip
    text, table = tabled.render("md"), folder / "table.md"
    written(text, table)
    written(tabled.render("csv"), folder / "table.csv")
    return text, [table, folder / "table.csv", *per_run_data(records, curves, metric, [], table)]


def check_options(reduce_by: str, fmt: str, k: int, fit: str | None, fit_from: float, x: str | None,
                  power: float | None, margin: float, alpha: float, direction: str | None) -> None:  # fmt: skip
    if reduce_by not in REDUCE:
        raise UserError(f"--reduce {reduce_by} is not valid (valid: {', '.join(REDUCE)})")
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt} is not valid (valid: {', '.join(FORMATS)})")
    if k < 1:
        raise UserError(f"--k {k} is not valid (valid: 1 or more)")
    if fit is not None and fit not in FITS:
        raise UserError(f"--fit {fit} is not valid (valid: {', '.join(FITS)})")
    scaling_report.check_fit_from(fit_from)
    if x is not None:
        compute_axis.check_axis(x)
    if power is not None and not power > 0:
        raise UserError(f"--power {power} is not valid (valid: the Δ to detect, > 0, in the metric's units, e.g. 0.02)")
    if not margin > 0:
        raise UserError(f"--margin {margin} is not valid (valid: > 0, in the metric's units, e.g. 0.02)")
    if not 0 < alpha < 0.5:
        raise UserError(f"--alpha {alpha} is not valid (valid: above 0 and below 0.5, e.g. 0.05: TOST's one-sided "
                        "tests need α < 0.5)")  # fmt: skip
    if direction not in (None, *DIRECTIONS):
        raise UserError(f"direction {direction} is not valid (valid: {', '.join(DIRECTIONS)})")


def selected(experiment, study, metric: str, extras: list[str], seeds, arm_names, baseline, *, with_failed: bool):
    """The arms of the FINISHED runs (and, ``with_failed``, the FAILED ones) of the experiment or study, ``--seeds``,
    ``--arm`` and ``--baseline`` applied -> (arms, the baseline arm, the metrics the runs logged)."""
    runs = only_seeds(load_runs(experiment, study), seeds)
    failed = seeds_of(load_failed(experiment, study), seeds) if with_failed else []
    known = sorted({m for r in runs for m in r.data.metrics})
    for name in [metric, *extras]:
        if name not in known:
            raise UserError(f"no metric '{name}' in these runs (valid: {', '.join(known)})")
    found = group_arms(runs, failed)
    named_base = None if baseline is None else pick_arm(found, baseline, "--baseline")
    arms = only_arms(found, arm_names, named_base)
    return arms, named_base or default_baseline(arms), known


@dataclass
class Tabled:
    """A table's numbers (``report_table``) and what its caption, legend and notes say; ``power``: a planning one."""

    frame: pd.DataFrame
    context: report_format.Context
    power: float | None = None

    def render(self, fmt: str) -> str:
        if self.power is not None:
            return report_format.render_power(self.frame, self.context, self.power, fmt)
        return report_format.render(self.frame, self.context, fmt)


def tabulate(arms: list[Arm], base: Arm, records: dict, context: report_format.Context, asked: Asked) -> Tabled:
    """The ablation table of ``records`` (or the planning one); a metric known to be better lower is judged so."""
    lower = asked.direction == "lower" if asked.direction else known_lower_is_better(context.metric)
    judging = replace(asked.judging, lower_is_better=lower)
    context.judging = judging
    labels = [(a.label, a.key) for a in arms]
    if asked.power is not None:
        return Tabled(power_table(labels, base.label, records, asked.power, judging), context, asked.power)
    frame, context.notes = build_table(labels, base.label, records, context.extras, judging if asked.stats else None)
    return Tabled(frame, context)


def on_store(arms, base, known, client, curves, metric, extras, how, k, x, source, asked: Asked):
    """The table of tracked ``arms`` whose ``curves`` (of ``metric`` and ``extras``) are fetched -> (Tabled, the
    records per arm); the SE and health curves fetched here, over steps."""
    what = in_words(how, k)
    axis = Axis()
    if x is not None:
        axis = put_on_axis(arms, curves, metric, extras, x)
        what += "" if x == "step" else f" up to {x} = {compute_axis.amount(axis.budget)}"
    context = report_format.Context(
        metric=metric,
        reduce=what,
        baseline=base.label,
        common=common_overrides(arms),
        source=source,
        extras=[*extras, *axis.columns],
        described=axis.columns,
        axis=x or "step",
        budget=axis.caption,
    )
    every = [r for a in arms for r in [*a.runs, *a.failed]]
    raw = histories(client, every, [m for m in (se_metric(metric), *health.METRICS) if m in known])
    records = records_of(arms, curves, raw, metric, context.extras, how, k)
    return tabulate(arms, base, records, context, asked), records


def from_file(path: Path, metric: str | None, extras: list[str], how: str, k: int, baseline, arm_names, seeds,
              asked: Asked) -> Tabled:  # fmt: skip
    """``rlx report --runs FILE``: the table rebuilt from a ``*-runs.csv`` (its extras from the ``*-curves.csv``
    beside it)."""
    found, records = run_records.read(path, extras, how, k)
    if metric is not None and metric != found:
        raise UserError(f"--metric {metric}: {path} holds {found} (valid: --metric {found}, or no --metric)")
    if seeds is not None:
        wanted = {s.strip() for s in seeds.split(",") if s.strip()}
        records = [r for r in records if r.seed in wanted]
        if not records:
            raise UserError(f"--seeds {seeds}: {path} has no run of these seeds")
    arms = []
    for label in dict.fromkeys(r.arm for r in records):  # the arms in the file's order, which the table's was
        words = override_tokens(label.split(" #")[0])
        ablate = next((w.split("=", 1)[1] for w in words if w.startswith("+ablate=")), "none")
        arms.append(Arm(words[1:], words[0] if words else "?", ablate, label=label))
    named_base = None if baseline is None else pick_arm(arms, baseline, "--baseline")
    if arm_names:
        chosen = {id(pick_arm(arms, name, "--arm")) for name in arm_names} | ({id(named_base)} if named_base else set())
        arms = [a for a in arms if id(a) in chosen]
    base = named_base or default_baseline(arms)
    by_arm = {a.label: [r for r in records if r.arm == a.label] for a in arms}
    curves = path.name.removesuffix("-runs.csv") + "-curves.csv"
    described = {m: f"{in_words(how, k)} per run of its curve in {curves}, mean ± sample std over seeds" for m in extras}
    context = report_format.Context(metric=found, reduce=f"{path.name}'s value", baseline=base.label, common="",
                                    source=f"runs {path}", extras=extras, described=described)  # fmt: skip
    return tabulate(arms, base, by_arm, context, asked)


def in_words(how: str, k: int) -> str:
    """``--reduce`` and ``--k`` as a caption says them: last, max, mean of the last k, mean of the first k."""
    return {"mean_last_k": f"mean of the last {k}", "mean_first_k": f"mean of the first {k}"}.get(how, how)


def records_of(arms: list[Arm], curves: dict, raw: dict, metric: str, extras: list[str], how: str, k: int):
    """label -> a ``RunRecord`` per run of the arm (its FINISHED runs, then its FAILED ones). ``curves``: the table's
    curves (on its axis), ``raw``: the step curves of the metric's SE and of ``health.METRICS``."""
    out = {}
    for arm in arms:
        out[arm.label] = []
        for run, status in [(r, "FINISHED") for r in arm.runs] + [(r, "FAILED") for r in arm.failed]:
            run_id = run.info.run_id
            value = reduced(curves.get((run_id, metric), []), how, k) if status == "FINISHED" else math.nan
            record = RunRecord(arm.label, run.data.tags.get("rlx.seed", run_id), run_id, status, value)
            record.se = reduced(raw.get((run_id, se_metric(metric)), []), how, k)
            record.figures = health.figures({m: raw.get((run_id, m), []) for m in health.METRICS})
            record.extras = {m: reduced(curves.get((run_id, m), []), how, k) for m in extras}
            out[arm.label].append(record)
    return out


def data_and_plots(records: dict, arms, curves, metrics: list[str], out: Path | None, plots: Path | None, axis):
    """The per-run data beside ``out`` (``per_run_data``) and the curves of ``metrics`` in ``plots``, when given."""
    written_paths = per_run_data(records, curves, metrics[0], metrics[1:], out) if out is not None else []
    if plots is not None:
        written_paths += report_format.plot_curves(arms, curves, metrics, plots, axis)
    for path in written_paths:
        print(f"wrote {path}", flush=True)


@dataclass
class Axis:
    """A compute axis put on the curves: the common budget, the caption's words for it, and the table's extra
    columns (name -> legend), whose one-point curves the report added."""

    budget: float = float("nan")
    caption: str = ""
    columns: dict[str, str] = field(default_factory=dict)


def put_on_axis(arms: list[Arm], curves: dict, metric: str, extras: list[str], x: str) -> Axis:
    """``curves`` of the arms' runs in place on axis ``x``, cut at the common budget (``compute_axis``); adds the
    one-point curves of the AUC and of the samples each run drew in all -> the Axis."""
    runs = [r.info.run_id for a in arms for r in a.runs]
    samples = {run: curves.get((run, "perf/samples"), []) for run in runs}
    spent = on_axis(arms, curves, [metric, *extras], x)
    budget = compute_axis.common_budget([curves[run, metric] for run in runs])
    starts = {run: curves[run, metric][0][0] for run in runs if curves[run, metric]}
    late = [a.label for a in arms if any(starts.get(r.info.run_id, budget) > budget for r in a.runs)]
    auc = f"AUC of {metric}"
    columns = {auc: f"the area under the run's {metric} curve over {x} (to the budget) divided by its {x} range: "
                    "the curve's mean height, mean ± sample std over seeds"}  # fmt: skip
    for run in runs:
        for name in [metric, *extras]:
            curves[run, name] = compute_axis.cut(curves[run, name], budget)
        curves[run, auc] = [(0, compute_axis.area(curves[run, metric]))]
    if all(samples.values()):
        columns["samples drawn"] = "answers each run sampled in all (perf/samples at its end), mean ± std over seeds"
        for run in runs:
            curves[run, "samples drawn"] = samples[run][-1:]
    caption = (
        f"at equal {compute_axis.UNITS[x]}: every run's curve cut at {x} = {compute_axis.amount(budget)}, the "
        "smallest budget any run reached, its value there interpolated"
        if spent
        else "AUC over steps"
    )
    if late:  # e.g. value pretraining's answers, drawn before the first evaluation
        caption += (
            f"; runs of {', '.join(late)} have no point before the budget (their first evaluation comes after "
            f"{x} = {compute_axis.amount(budget)}: what they sampled before RL counts), so no value: compare "
            "them with --x step"
        )
    return Axis(budget, caption, columns)


def on_axis(arms: list[Arm], curves: dict, names: list[str], x: str) -> str | None:
    """The curves of ``names`` of the arms' runs, in place, from [(step, value)] to [(x, value)] -> the metric that
    gives x (None for steps); a UserError when a run did not log it."""
    spent, runs = compute_axis.AXES[x], [r.info.run_id for a in arms for r in a.runs]
    if spent is not None and any(not curves.get((run, spent)) for run in runs):
        raise UserError(
            f"--x {x}: some runs did not log {spent} (runs from before rlx logged compute; valid: --x step)"
        )
    for run in runs:
        for name in names:
            points = curves[run, name]
            curves[run, name] = compute_axis.on_axis(points, curves[run, spent]) if spent else points
    return spent


def per_run_data(records: dict[str, list[RunRecord]], curves: dict, metric: str, extras: list[str], out: Path):
    """``<out stem>-runs.csv`` (``run_records``: a record per run) and ``<out stem>-curves.csv`` (arm, seed, run id,
    metric, x, value: every point the table and plots used) beside ``out``, so that a report's statistics can be
    recomputed without the MLflow store (``rlx report --runs``) -> their paths."""
    listed = [r for runs in records.values() for r in runs]
    points = [
        {"arm": r.arm, "seed": r.seed, "run_id": r.run_id, "metric": name, "x": at, "value": value}
        for r in listed
        for name in [metric, *extras]
        for at, value in curves.get((r.run_id, name), [])
    ]
    runs_path, curves_path = out.with_name(f"{out.stem}-runs.csv"), out.with_name(f"{out.stem}-curves.csv")
    run_records.write(listed, metric, runs_path)
    pd.DataFrame(points, columns=["arm", "seed", "run_id", "metric", "x", "value"]).to_csv(curves_path, index=False)
    return [runs_path, curves_path]


def written(text: str, out: Path | None) -> str:
    """``text``, also written to ``out`` when given."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text
