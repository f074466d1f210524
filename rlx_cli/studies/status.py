"""``rlx status --study NAME``: where each point of a study stands, and about how long the rest will take.

A point is

- **finished**: its run ended FINISHED;
- **running** (step x of y): its run is RUNNING and its worker holds the point's lock (``study.WORKER_LOCK``);
- **stopped** (step x of y): its run was KILLED, or is RUNNING with no live worker; the next launch of the same
  command goes on from its last checkpoint (or starts it again when it had none);
- **failed**: its run ended FAILED (its error is shown); the next launch tries it again;
- **pending**: no run yet (the points come from the study's ``study.json``).

The time left: per running point its steps to go at its own ``perf/step_s``; per pending point a finished run's
start-up time (a running one's so far, until one finished) plus its steps at the study's median step time; the
sum spread over the driver's ``--jobs``.
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rlx_cli.config import locks
from rlx_cli.config.errors import UserError
from rlx_cli.loops.track import tracking_uri
from rlx_cli.studies.study import (
    DRIVER_LOCK,
    STUDY_NAME,
    STUDY_ROLE,
    WORKER_LOCK,
    canonical,
    canonical_tokens,
    last_checkpoint_step,
    output_folder,
    quoted,
    read_points,
)

STATES = ("finished", "running", "stopped", "failed", "pending")


@dataclass
class PointStatus:
    label: str  # the overrides that set the point apart from the study's other points
    state: str  # one of STATES
    step: int  # the last step its run logged
    steps: int
    note: str = ""
    step_s: float | None = None  # seconds a step: a running point's pace, else its run's latest perf/step_s
    overhead_s: float | None = None  # wall time beyond its steps (start-up, evaluations, saving); so far if running


@dataclass
class StudyStatus:
    study: str
    experiment: str
    driver: bool  # a driver (rlx sweep / ablate) holds the study's lock
    jobs: int
    points: list[PointStatus]
    looks: list[str] = field(default_factory=list)  # a declared study's lines: its looks, each arm's state

    def count(self, state: str) -> int:
        return sum(p.state == state for p in self.points)

    def seconds_left(self, states: tuple[str, ...]) -> float | None:
        """The work of the points in ``states`` spread over the jobs (at least the longest point); None if unknown."""
        step_times = [p.step_s for p in self.points if p.step_s]
        if not step_times:
            return None
        step_s = statistics.median(step_times)
        overheads = {state: [p.overhead_s for p in self.points if p.state == state and p.overhead_s is not None]
                     for state in ("finished", "running")}  # fmt: skip
        known = overheads["finished"] or overheads["running"]  # a running one's so far, until one finished
        overhead = statistics.median(known) if known else 0.0
        left = [
            (p.steps - p.step) * (p.step_s or step_s) + (0.0 if p.state == "running" else overhead)
            for p in self.points
            if p.state in states
        ]
        return max(sum(left) / max(1, self.jobs), max(left)) if left else 0.0


def gather(study: str) -> StudyStatus:
    """The study's points from its ``study.json`` and MLflow, each with its state."""
    from rlx_cli.studies.runs import connect

    if not STUDY_NAME.match(study):
        raise UserError(f"--study '{study}' is not a valid name (valid: letters, digits, '_', '-', '.')")
    mlflow, client = connect()
    parents = mlflow.search_runs(
        search_all_experiments=True, filter_string=f"tags.`rlx.role` = '{STUDY_ROLE}'", output_format="list"
    )
    parent = next((r for r in parents if r.data.tags.get("rlx.study") == study), None)
    if parent is None:
        names = sorted({r.data.tags.get("rlx.study", "") for r in parents} - {""})
        raise UserError(f"no study '{study}' at {tracking_uri()} (studies: {', '.join(names) or '(none)'})")
    home = Path(parent.data.tags["rlx.study_dir"]) if "rlx.study_dir" in parent.data.tags else None
    planned = read_points(home) if home else {}
    runs = mlflow.search_runs(
        [parent.info.experiment_id], f"tags.`rlx.study` = '{study}'", output_format="list", max_results=50_000
    )
    newest: dict[str, object] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        if run.data.tags.get("rlx.role") != STUDY_ROLE and "rlx.overrides" in run.data.tags:
            newest[canonical(run.data.tags["rlx.overrides"])] = run
    tokens = {key: canonical_tokens(plan["overrides"]) for key, plan in planned.items()}
    tokens |= {
        key: canonical_tokens(run.data.tags["rlx.overrides"]) for key, run in newest.items() if key not in tokens
    }
    points = []
    for key, label in point_labels(tokens).items():
        run, plan = newest.get(key), planned.get(key, {})
        if plan.get("arm"):  # a declared study's point: its arm's name and its seed
            seed = next((o.split("=")[1] for o in plan["overrides"] if o.startswith("seed=")), "?")
            label = f"{plan['arm']} seed={seed}"
        folder = Path(plan["folder"]) if plan else output_folder(run.data.tags["rlx.overrides"])
        steps = int(plan.get("steps") or run.data.params.get("trainer.steps", 0))
        points.append(point_status(client, label, run, folder, steps))
    experiment = client.get_experiment(parent.info.experiment_id).name
    driver = home is not None and locks.held(home / DRIVER_LOCK)
    looks = look_lines(home) if home else []
    return StudyStatus(study, experiment, driver, int(parent.data.tags.get("rlx.jobs", 1)), points, looks)


def look_lines(home: Path) -> list[str]:
    """A declared study's looks and, per arm, the seeds it has run and whether it was decided or runs more."""
    from rlx_cli.studies import sequential, study_plan
    from rlx_cli.studies.report_read import plan_values
    from rlx_cli.studies.report_table import known_lower_is_better

    plan = study_plan.stored(home)
    if plan is None:
        return []
    lower = plan.direction == "lower" if plan.direction else known_lower_is_better(plan.metric)
    values = plan_values(plan)
    state = sequential.replay(values, plan, lower_is_better=lower)
    lines = [f"plan: {study_plan.describe(plan)}; {state.looks_done} of {len(plan.looks)} looks done"]
    rows = [("arm", "seeds", "state")]
    for arm, s in state.arms.items():
        if s.look is not None:
            said = f"decided at look {s.look + 1}: {s.verdict.label}"
        elif s.running:
            said = f"running: look {state.looks_done + 1} needs {state.next_seeds[arm]} seeds"
        else:
            said = f"inconclusive at {plan.looks[-1]} seeds" if state.looks_done else "waiting for the first look"
        rows.append((arm, str(len(values.get(arm, {}))), said))
    rows.append((f"{plan.baseline} (baseline)", str(len(values.get(plan.baseline, {}))), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return lines + [("  " + r[0].ljust(widths[0]) + "  " + r[1].ljust(widths[1]) + "  " + r[2]).rstrip() for r in rows]


def point_labels(points: dict[str, list[str]]) -> dict[str, str]:
    """Each point's key -> the overrides that set it apart from the other points (all of its own when none do), as a
    shell needs them: ``'task.config={min_terms: 2, max_terms: 3}'`` stays one override."""
    common = set.intersection(*map(set, points.values())) if points else set()
    return {key: " ".join(map(quoted, [t for t in own if t not in common] or own)) for key, own in points.items()}


def point_status(client, label: str, run, folder: Path | None, steps: int) -> PointStatus:
    if run is None:
        return PointStatus(label, "pending", 0, steps)
    info, step_s = run.info, run.data.metrics.get("perf/step_s")
    started, resumed_from = attempt(folder)
    if info.status == "FINISHED":
        end = info.end_time / 1000 if info.end_time else None
        overhead = end - started - (steps - resumed_from) * step_s if step_s and started and end else None
        return PointStatus(label, "finished", steps, steps, step_s=step_s, overhead_s=overhead)
    logged = sorted(client.get_metric_history(info.run_id, "train/reward"), key=lambda m: m.step)
    step = logged[-1].step if logged else 0
    alive = folder is not None and locks.held(folder / WORKER_LOCK)
    if info.status == "RUNNING" and alive:
        this_launch = [m for m in logged if m.step > resumed_from]
        if len(this_launch) >= 2:  # its pace, evaluations included, rather than the last step's time
            step_s = (this_launch[-1].timestamp - this_launch[0].timestamp) / 1000 / (len(this_launch) - 1)
        so_far = time.time() - started - (step - resumed_from) * step_s if step_s and started else None
        return PointStatus(label, "running", step, steps, step_s=step_s, overhead_s=so_far)
    if info.status == "FAILED":
        error = run.data.tags.get("rlx.error", "").strip().splitlines()
        return PointStatus(label, "failed", step, steps, f"error: {error[-1][:200] if error else '?'}", step_s)
    checkpoint = last_checkpoint_step(folder) if folder is not None else None
    gone = "its worker is gone; " if info.status == "RUNNING" else ""
    then = f"goes on from its step-{checkpoint} checkpoint" if checkpoint else "starts again"
    return PointStatus(label, "stopped", step, steps, f"{gone}{then} at the next launch", step_s)


RESUMED = re.compile(r"^resuming from .* \(step (\d+) of \d+\)")


def attempt(folder: Path | None) -> tuple[float | None, int]:
    """When the point's latest launch started its worker (the launcher's ``---`` line in ``worker.log``, as a
    Unix time) and the step it resumed from (0: it started fresh)."""
    try:
        lines = (folder / "worker.log").read_text(errors="replace").splitlines() if folder else []
    except OSError:
        return None, 0
    starts = [i for i, line in enumerate(lines) if line.startswith("--- ")]
    if not starts:
        return None, 0
    try:
        started = datetime.strptime(lines[starts[-1]][4:23], "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        return None, 0
    resumed = (RESUMED.match(line) for line in lines[starts[-1] :])
    return started, next((int(m.group(1)) for m in resumed if m), 0)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown until a step has been timed"
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.1f} min"


def render(status: StudyStatus) -> str:
    counts = ", ".join(f"{status.count(s)} {s}" for s in STATES)
    n = len(status.points)
    lines = [f"study '{status.study}' · experiment '{status.experiment}' · {n} point{'s' * (n != 1)}: {counts}"]
    waiting = status.count("stopped") + status.count("failed")
    if status.driver:
        left = duration(status.seconds_left(("running", "pending")))
        again = f"; {waiting} stopped or failed wait for the next launch" if waiting else ""
        lines.append(f"driver: running, {status.jobs} jobs · time left: {left}{again}")
    elif waiting + status.count("pending"):
        left = duration(status.seconds_left(("running", "stopped", "failed", "pending")))
        lines.append(f"driver: not running · the same command again finishes the rest: {left} at {status.jobs} jobs")
    else:
        lines.append("driver: not running")
    lines += status.looks
    rows = [("state", "step", "point", "")] + [
        (p.state, f"{p.step}/{p.steps}" if p.state != "pending" else f"-/{p.steps}", p.label, p.note)
        for p in status.points
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for *cells, note in rows:
        lines.append(("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + note).rstrip())
    return "\n".join(lines) + "\n"


def status_command(study: str, *, watch: bool = False, every: float = 5.0) -> None:
    """Print the study's status; with ``watch``, again every ``every`` seconds until no point runs or waits for
    a live driver: redrawn in place on a terminal, one snapshot after another elsewhere (a log)."""
    if every <= 0:
        raise UserError(f"--every {every} is not valid (valid: seconds between refreshes, > 0)")
    if not watch:
        print(render(gather(study)), end="")
        return
    try:
        if not sys.stdout.isatty():
            for status in snapshots(study, every):
                print(render(status), flush=True)
            return
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        with Live(console=Console(file=sys.stdout), auto_refresh=False) as live:
            for status in snapshots(study, every):
                live.update(Text(render(status)), refresh=True)
    except KeyboardInterrupt:
        pass  # stops watching, not the study


def snapshots(study: str, every: float):
    status = gather(study)
    yield status
    while status.count("running") or (status.driver and status.count("pending")):
        time.sleep(every)
        status = gather(study)
        yield status
