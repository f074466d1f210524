"""``rlx sweep --plan FILE``: a declared study run by rlx, in one look (fixed) or look by look until each arm is
decided (``--until-decided``).

1. read the plan (``study_plan``), compose and validate each arm once; with ``--dry-run`` print the design and stop
2. take the study's driver lock; store the plan at the first launch (refuse a changed one), log it on the study's
   MLflow parent run (artifact ``plan.yaml``, tag ``rlx.plan_declared``)
3. judge what has FINISHED (``sequential.replay``: a pure function of the runs, so a relaunch resumes where the
   study stood); run the next look's seeds of the arms still undecided and of the baseline, as ``rlx sweep`` runs
   points (FINISHED ones skipped, interrupted ones resumed from their checkpoints, every launcher); again, until
   every arm is decided or the last look is done
4. the study's table, judged by its plan (``rlx report --study NAME``)

``--runs FILE``: the earlier looks' runs of a study whose store is elsewhere (a lost machine, another cluster), as
``rlx report --out`` wrote them (``*-runs.csv``, the arms named as the plan names them). Their seeds count as run:
judged with this store's, and only the seeds they lack run here; the stored copy of the plan keeps when it was first
declared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from rlx_cli.config.errors import UserError
from rlx_cli.loops.track import git_sha
from rlx_cli.studies import run_records, sequential, study_plan
from rlx_cli.studies.launchers import check_launcher
from rlx_cli.studies.report_read import plan_values
from rlx_cli.studies.report_table import known_lower_is_better
from rlx_cli.studies.study import Point, Study, driver_lock, key_of
from rlx_cli.studies.sweep import launch, plan, print_table, study_home

TITLE = "rlx sweep --plan"


def arm_points(declared: study_plan.StudyPlan) -> dict[str, Point]:
    """Each arm composed and validated once, as its seed-0 point (its runs log to the plan's experiment)."""
    out = {}
    for i, (name, overrides) in enumerate(declared.arms.items()):
        words = [o for o in overrides if key_of(o) != "seed"]
        if not any(key_of(o) == "tracking.experiment" for o in words):
            words.append(f"tracking.experiment={declared.experiment}")
        (point,) = plan([[*words, "seed=0"]])
        if not point.tracked:
            raise UserError(f"plan arm '{name}': tracking=none (valid: a tracked run; a declared study is judged from "
                            "its MLflow runs)")  # fmt: skip
        out[name] = replace(point, index=i, overrides=words, arm=name)
    return out


def seeded(point: Point, seeds: Iterable[int], arms: int) -> list[Point]:
    return [replace(point, index=point.index + arms * s, overrides=[*point.overrides, f"seed={s}"], seed=s)
            for s in seeds]  # fmt: skip


def earlier_values(path: Path | None, declared: study_plan.StudyPlan) -> dict[str, dict[int, float]]:
    """``--runs FILE`` -> arm -> {seed: the plan's metric} of the FINISHED runs the file holds ({} without one)."""
    if path is None:
        return {}
    metric, records = run_records.read(path, [], declared.reduce, 1)
    if metric != declared.metric:
        raise UserError(f"--runs {path}: its runs hold {metric}, the plan judges {declared.metric} (valid: the "
                        "*-runs.csv of this study's table)")  # fmt: skip
    unknown = sorted({r.arm for r in records} - set(declared.arms))
    if unknown:
        raise UserError(f"--runs {path}: arm '{unknown[0]}' is not in the plan (valid: {', '.join(declared.arms)})")
    out: dict[str, dict[int, float]] = {}
    for record in records:
        if record.status == "FINISHED" and record.seed.isdigit() and not math.isnan(record.value):
            out.setdefault(record.arm, {})[int(record.seed)] = record.value
    return out


def next_points(state: sequential.Replay, points: dict[str, Point], earlier: dict[str, dict[int, float]]):
    """The next look's points: each running arm's (and the baseline's) seeds up to the look's, but those ``earlier``
    holds."""
    lacking = {arm: [s for s in range(n) if s not in earlier.get(arm, {})] for arm, n in state.next_seeds.items()}
    return [p for arm, seeds in lacking.items() for p in seeded(points[arm], seeds, len(points))]


def say(state: sequential.Replay, declared: study_plan.StudyPlan) -> None:
    decided = {a: s for a, s in state.arms.items() if s.look is not None}
    words = ", ".join(f"{a} {s.verdict.label} at look {s.look + 1}" for a, s in decided.items()) or "none"
    going = ", ".join(a for a, s in state.arms.items() if s.running) or "none"
    print(f"{TITLE}: {state.looks_done} of {len(declared.looks)} looks done; decided: {words}; running: {going}",
          flush=True)  # fmt: skip


def plan_command(path: Path, *, until_decided: bool = False, max_seeds: int | None = None, every: int | None = None,
                 control: bool | None = None, jobs: int = 1, launcher: str = "local", dry_run: bool = False,
                 rerun: bool = False, report: bool = True, runs: Path | None = None) -> int:  # fmt: skip
    """``rlx sweep --plan FILE`` -> the exit code (1 when a run failed: the same command tries it again)."""
    changes = {"design": "until_decided" if until_decided else None, "max_seeds": max_seeds, "every": every,
               "control": control}  # fmt: skip
    declared = study_plan.load(path, **changes)
    points = arm_points(declared)
    lower = declared.direction == "lower" if declared.direction else known_lower_is_better(declared.metric)
    earlier = earlier_values(runs, declared)
    if dry_run and earlier:
        state = sequential.replay(earlier, declared, lower_is_better=lower)
        say(state, declared)
        todo = next_points(state, points, earlier)
        print(f"{TITLE}: the next look, beside the {sum(map(len, earlier.values()))} runs in {runs}: {len(todo)} runs")
        for point in todo:
            print(f"  {point.arm} seed {point.seed}")
        return 0
    if dry_run:
        first = [p for point in points.values() for p in seeded(point, range(declared.seeds), len(points))]
        print(f"{TITLE}: study '{declared.study}', {len(points)} arms, {study_plan.describe(declared)}; the first "
              f"look: {len(first)} runs")  # fmt: skip
        for name, point in points.items():
            print(f"  {name}: {' '.join(point.overrides)}")
        return 0
    check_launcher(launcher)
    if rerun:
        raise UserError("--rerun does not apply to a declared study (valid: a new study: change study: in the plan)")
    home = study_home(list(points.values()), declared.study)
    command = f"rlx sweep --plan {path}" + (" --until-decided" if until_decided else "")
    command += f" --runs {runs}" if runs else ""  # the command that resumes it, recorded on the study's runs
    with driver_lock(home, declared.study):
        declared = study_plan.declare(declared, home, git_sha(), carried=bool(earlier))
        record_plan(declared, home, command, jobs)
        state = sequential.replay(values(earlier, declared), declared, lower_is_better=lower)
        while not state.finished:
            say(state, declared)
            todo = next_points(state, points, earlier)
            code = launch(todo, declared.study, home, jobs=jobs, launcher=launcher, rerun=False, command=command,
                          title=TITLE)  # fmt: skip
            if code:
                return code
            before, state = state, sequential.replay(values(earlier, declared), declared, lower_is_better=lower)
            if state.next_seeds == before.next_seeds and state.looks_done == before.looks_done:
                raise UserError(f"study '{declared.study}': its runs FINISHED without {declared.metric} (valid: a "
                                "metric every run logs, e.g. eval/accuracy_sampled)")  # fmt: skip
        say(state, declared)
    if report:
        print_table(declared.study, home, TITLE)
    if earlier:
        print(f"{TITLE}: the table above holds this store's runs; the earlier looks' are in {runs}")
    return 0


def values(earlier: dict[str, dict[int, float]], declared: study_plan.StudyPlan) -> dict[str, dict[int, float]]:
    """The runs of ``--runs`` and of this store (a seed run in both: this store's)."""
    here = plan_values(declared)
    return {arm: earlier.get(arm, {}) | here.get(arm, {}) for arm in {*earlier, *here}}


def record_plan(declared: study_plan.StudyPlan, home: Path, command: str, jobs: int) -> None:
    """The declared plan on the study's MLflow parent run, where ``rlx report`` and a reader of the store find it."""
    store = Study(declared.study, declared.experiment, command, home, jobs)
    store.client.log_text(store.parent_id, study_plan.dumped(declared), study_plan.FILE)
    store.client.set_tag(store.parent_id, "rlx.plan_declared", declared.declared)
    store.client.set_terminated(store.parent_id, "FINISHED")  # each look's launch opens it again
