"""``rlx report``'s first stage: the runs it tabulates, read into arms of per-run records.

- **From the store** (``--experiment``/``--study``): the FINISHED runs (and the FAILED ones, for the health flags),
  grouped into arms by their overrides minus the seed (``arms.group_arms``), ``--seeds``, ``--arm`` and
  ``--baseline`` applied; a study declared in a plan (``study_plan``) names its arms by the plan's names and brings
  the metric, margin, α, direction and baseline it declared. The curves of the metric and the extra columns, put on
  a compute axis when asked (``compute_axis``), become one ``RunRecord`` a run (``run_records``).
- **From a file** (``--runs``): the records a report wrote, its extra columns from the curves beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rlx_cli.config.errors import UserError
from rlx_cli.studies import acted, compute_axis, health, report_format, run_records, study_plan
from rlx_cli.studies.arms import (
    Arm,
    ablation_of,
    algo_of,
    common_overrides,
    default_baseline,
    group_arms,
    only_arms,
    pick_arm,
)
from rlx_cli.studies.run_records import RunRecord, reduced, se_metric
from rlx_cli.studies.runs import connect, histories, load_failed, load_runs, only_seeds, seeds_of
from rlx_cli.studies.study import STUDY_ROLE, override_tokens

DEFAULT_METRIC = "eval/accuracy"


@dataclass
class Read:
    """What the later stages need: the arms in order, the baseline, each arm's records (label -> one a run), the
    table's words (``report_format.Context``) and, from the store, the curves the records came from."""

    arms: list[Arm]
    base: Arm
    records: dict[str, list[RunRecord]]
    context: report_format.Context
    curves: dict = field(default_factory=dict)  # (run id, metric) -> [(x, value)]
    plan: study_plan.StudyPlan | None = None


def in_words(how: str, k: int) -> str:
    """``--reduce`` and ``--k`` as a caption says them: last, max, mean of the last k, mean of the first k."""
    return {"mean_last_k": f"mean of the last {k}", "mean_first_k": f"mean of the first {k}"}.get(how, how)


def declared(study: str | None) -> study_plan.StudyPlan | None:
    """The plan a study was declared with (``plan.yaml`` in the folder its parent run names), if any."""
    if study is None:
        return None
    mlflow, _ = connect()
    parents = mlflow.search_runs(
        search_all_experiments=True, output_format="list",
        filter_string=f"tags.`rlx.study` = '{study}' and tags.`rlx.role` = '{STUDY_ROLE}'",
    )  # fmt: skip
    folders = [Path(r.data.tags["rlx.study_dir"]) for r in parents if "rlx.study_dir" in r.data.tags]
    return next((p for p in map(study_plan.stored, folders) if p is not None), None)


def named_by_plan(arms: list[Arm], plan: study_plan.StudyPlan | None) -> list[Arm]:
    """A declared study's arms named as its plan names them (the tag ``rlx.arm`` each run carries)."""
    if plan is None:
        return arms
    for arm in arms:
        names = {r.data.tags.get("rlx.arm") for r in [*arm.runs, *arm.failed]} - {None}
        if len(names) == 1:
            arm.label = names.pop()
    return arms


def select(request, metric: str, plan, *, with_failed: bool) -> tuple[list[Arm], Arm, list[str]]:
    """The arms of the FINISHED runs (and, ``with_failed``, the FAILED ones) of the experiment or study, ``--seeds``,
    ``--arm`` and ``--baseline`` applied -> (arms, the baseline arm, the metrics the runs logged)."""
    runs = only_seeds(load_runs(request.experiment, request.study), request.seeds)
    failed = seeds_of(load_failed(request.experiment, request.study), request.seeds) if with_failed else []
    known = sorted({m for r in runs for m in r.data.metrics})
    for name in [metric, *request.extras]:
        if name not in known:
            raise UserError(f"no metric '{name}' in these runs (valid: {', '.join(known)})")
    found = named_by_plan(group_arms(runs, failed), plan)
    baseline = request.baseline or (plan.baseline if plan else None)
    named_base = None if baseline is None else pick_arm(found, baseline, "--baseline")
    arms = only_arms(found, request.arm_names, named_base)
    return arms, named_base or default_baseline(arms), known


def from_store(request, metric: str, plan, arms: list[Arm], base: Arm, known: list[str]) -> Read:
    """The records of tracked ``arms``: their curves of ``metric`` and the extras fetched (on ``request.x``'s axis),
    the SE and health curves over steps."""
    _, client = connect()
    spent = [m for m in ("perf/samples", compute_axis.AXES.get(request.x)) if m in known]  # absent from older runs
    curves = histories(client, [r for a in arms for r in a.runs], [metric, *request.extras, *spent])
    what, axis = in_words(request.reduce_by, request.k), compute_axis.Axis()
    if request.x is not None:
        axis = compute_axis.put_on_axis(arms, curves, metric, list(request.extras), request.x)
        what += "" if request.x == "step" else f" up to {request.x} = {compute_axis.amount(axis.budget)}"
    source = " · ".join(f"{k} {v}" for k, v in (("experiment", request.experiment), ("study", request.study)) if v)
    context = report_format.Context(
        metric=metric, reduce=what, baseline=base.label, common=common_overrides(arms), source=source,
        extras=[*request.extras, *axis.columns], described=axis.columns, axis=request.x or "step",
        budget=axis.caption,
    )  # fmt: skip
    every = [r for a in arms for r in [*a.runs, *a.failed]]
    raw = histories(client, every, [m for m in (se_metric(metric), *health.METRICS, *acted.METRICS) if m in known])
    records = records_of(arms, curves, raw, metric, context.extras, request.reduce_by, request.k)
    return Read(arms, base, records, context, curves, plan)


def from_file(request) -> Read:
    """``rlx report --runs FILE``: the records of a ``*-runs.csv`` (its extras from the ``*-curves.csv`` beside it);
    with ``--plan PLAN`` a declared study's, judged by the plan (its arms are the file's arm names)."""
    path, how, k = request.runs, request.reduce_by, request.k
    plan = study_plan.load(request.plan) if request.plan is not None else None
    found, records = run_records.read(path, list(request.extras), how, k)
    if request.metric is not None and request.metric != found:
        raise UserError(f"--metric {request.metric}: {path} holds {found} (valid: --metric {found}, or no --metric)")
    if request.seeds is not None:
        wanted = {s.strip() for s in request.seeds.split(",") if s.strip()}
        records = [r for r in records if r.seed in wanted]
        if not records:
            raise UserError(f"--seeds {request.seeds}: {path} has no run of these seeds")
    arms = []
    for label in dict.fromkeys(r.arm for r in records):  # the arms in the file's order, which the table's was
        if plan is not None and label in plan.arms:  # a plan's arm name: its overrides are the plan's
            words = plan.arms[label]
            arms.append(Arm(words, algo_of(words), ablation_of(words), label=label))
            continue
        words = override_tokens(label.split(" #")[0])
        arms.append(Arm(words[1:], words[0] if words else "?", ablation_of(words), label=label))
    baseline = request.baseline or (plan.baseline if plan else None)
    named_base = None if baseline is None else pick_arm(arms, baseline, "--baseline")
    if request.arm_names:
        chosen = {id(pick_arm(arms, name, "--arm")) for name in request.arm_names}
        arms = [a for a in arms if id(a) in chosen | ({id(named_base)} if named_base else set())]
    base = named_base or default_baseline(arms)
    by_arm = {a.label: [r for r in records if r.arm == a.label] for a in arms}
    curves = path.name.removesuffix("-runs.csv") + "-curves.csv"
    said = f"{in_words(how, k)} per run of its curve in {curves}, mean ± sample std over seeds"
    context = report_format.Context(metric=found, reduce=f"{path.name}'s value", baseline=base.label, common="",
                                    source=f"runs {path}", extras=list(request.extras),
                                    described=dict.fromkeys(request.extras, said))  # fmt: skip
    return Read(arms, base, by_arm, context, plan=plan)


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
            record.acted = acted.figures({m: raw.get((run_id, m), []) for m in acted.METRICS})
            record.extras = {m: reduced(curves.get((run_id, m), []), how, k) for m in extras}
            record.seconds = run_seconds(run)
            out[arm.label].append(record)
    return out


def run_seconds(run) -> float:
    """A run's wall time from its start to its end (NaN while it runs)."""
    end = run.info.end_time
    return (end - run.info.start_time) / 1000 if end else math.nan


def plan_values(declared: study_plan.StudyPlan) -> dict[str, dict[int, float]]:
    """arm -> {seed: the plan's metric, reduced} of the study's FINISHED runs (none yet: {})."""
    try:
        runs = load_runs(None, declared.study)
    except UserError:  # no store, or no FINISHED run yet
        return {}
    mine = (r for r in runs if r.data.tags.get("rlx.arm") in declared.arms)
    runs = [r for r in mine if r.data.tags.get("rlx.seed", "").isdigit()]
    _, client = connect()
    curves = histories(client, runs, [declared.metric])
    out: dict[str, dict[int, float]] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):  # a rerun of a seed replaces it
        value = reduced(curves[run.info.run_id, declared.metric], declared.reduce, 1)
        out.setdefault(run.data.tags["rlx.arm"], {})[int(run.data.tags["rlx.seed"])] = value
    return out
