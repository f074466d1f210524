"""``rlx sweep`` and ``rlx ablate``: a grid in Hydra's multirun syntax, one ``rlx train`` per point; resumable.

1. expand the overrides with Hydra's own parser and BasicSweeper (``a,b``, ``range()``, ``choice()``, ``glob()``)
2. compose and validate every point here, so a typo fails before anything runs or is written
3. take the study's driver lock, open the MLflow store, the experiment and the study's parent run here, before
   any worker does (workers that create a fresh SQLite store at the same moment race on its schema)
4. settle what an earlier launch left: wait for its live workers, mark runs whose worker died KILLED
5. skip the points the study already FINISHED (``--rerun`` runs them again); the others run in their stable
   folders (``study.point_folder``) with ``trainer.resume=true``, so an interrupted one goes on from its checkpoint
6. run each point as ``python -m rlx_cli train ...`` through a launcher, ``--jobs`` at a time; every run
   is a child of the study's parent run (``RLX_PARENT_RUN_ID``) tagged ``rlx.study`` (``RLX_STUDY``)
7. a point that failed before its run existed, or was killed hard, is still recorded FAILED; then a summary
8. the study's table with verdicts (``report.study_report``: ``rlx report --study NAME --stats`` on its main metric),
   printed and written beside the study as ``table.md`` and ``table.csv``; ``--no-report`` skips it
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from rlx_cli.config.compose import ablations, choices_of, compose
from rlx_cli.config.errors import UserError
from rlx_cli.loops.track import tracking_uri
from rlx_cli.studies.grid import applicable_overlays, expand
from rlx_cli.studies.launchers import Job, check_launcher, make_launcher
from rlx_cli.studies.study import (
    SEED_KEY,
    STUDY_NAME,
    WORKER_LOCK,
    Point,
    Study,
    driver_lock,
    key_of,
    last_checkpoint_step,
    point_folder,
    record_points,
    retire,
    worker_overrides,
)


def plan(points: list[list[str]]) -> list[Point]:
    """Compose and validate every point; all of them must log to one experiment."""
    from rlx_cli.config.validate import validate

    planned = []
    for index, overrides in enumerate(points):
        try:
            cfg = compose(overrides)
            validate(cfg)
        except UserError as error:
            raise UserError(f"{error} (in the point: {' '.join(overrides)})") from None
        choices = choices_of(cfg)
        ablate = ",".join(ablations(choices)) or "none"
        tracked = cfg.tracking.name != "none"
        experiment = str(cfg.tracking.experiment)
        algo, seed, steps = str(choices["algo"]), int(cfg.seed), int(cfg.trainer.steps)
        planned.append(Point(index, overrides, algo, ablate, seed, experiment, tracked, steps))
    where = sorted({(p.experiment if p.tracked else "tracking=none") for p in planned})
    if len(where) > 1:
        raise UserError(f"all points of a sweep log to one experiment, these go to: {', '.join(where)}")
    return planned


def worker_uri() -> str:
    """The tracking URI with relative paths made absolute, so workers find it from any directory."""
    uri = tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri[len('sqlite:///') :]).resolve()}"
    if "://" not in uri and not uri.startswith("file:"):
        return str(Path(uri).resolve())
    return uri


def worker_env(study: str, parent_id: str | None, jobs: int) -> dict[str, str]:
    env = {**os.environ, "RLX_STUDY": study, "MLFLOW_TRACKING_URI": worker_uri(), "PYTHONUNBUFFERED": "1"}
    if parent_id:
        env["RLX_PARENT_RUN_ID"] = parent_id
    threads = str(max(1, (os.cpu_count() or 1) // jobs))  # N workers share the cores instead of fighting for them
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, threads)
    return env


def last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def execute(
    points: list[Point],
    study: str,
    *,
    jobs: int,
    launcher: str,
    dry_run: bool,
    rerun: bool,
    command: str,
    title: str = "rlx sweep",
    report: bool = True,
) -> int:
    """Run the planned points, then (``report``) print the study's table; returns the exit code (0: none failed, 1:
    some failed)."""
    if not STUDY_NAME.match(study):
        raise UserError(f"--study '{study}' is not a valid name (valid: letters, digits, '_', '-', '.')")
    if dry_run:
        print(f"{title}: {len(points)} run{'s' * (len(points) != 1)} in study '{study}', {where_to(points)}")
        for point in points:
            print(f"  {point.index:03d}  {' '.join(point.overrides)}")
        return 0
    check_launcher(launcher)
    home = study_home(points, study)
    with driver_lock(home, study):
        code = launch(points, study, home, jobs=jobs, launcher=launcher, rerun=rerun, command=command, title=title)
    if points[0].tracked and report:
        print_table(study, home, title)
    return code


def where_to(points: list[Point]) -> str:
    return f"experiment '{points[0].experiment}' at {tracking_uri()}" if points[0].tracked else "tracking=none"


def study_home(points: list[Point], study: str) -> Path:
    """The study's folder: its driver lock, study.json and plan."""
    return point_folder(points[0], study).parent


def launch(points: list[Point], study: str, home: Path, *, jobs: int, launcher: str, rerun: bool, command: str,
           title: str) -> int:  # fmt: skip
    """Run the points the study has not FINISHED, under the driver lock the caller holds -> the exit code."""
    experiment = points[0].experiment if points[0].tracked else None
    folders = {p.index: point_folder(p, study) for p in points}
    store = Study(study, experiment, command, home, jobs) if experiment else None
    record_points(home, study, points, folders)
    todo = pending(points, folders, store, rerun, say=lambda line: print(f"{title}: {line}", flush=True))
    resumed = {p.index for p in todo if last_checkpoint_step(folders[p.index]) is not None}
    runner = make_launcher(launcher, jobs, home)
    common = set.intersection(*(set(p.overrides) for p in points))
    skipped = len(points) - len(todo)
    print(
        f"{title}: study '{study}': {len(todo)} to run ({len(resumed)} going on from their checkpoints), "
        f"{skipped} skipped (already FINISHED), {runner.describe()}; {where_to(points)}; "
        f"outputs and logs in {home}/\ncommon overrides: {' '.join(o for o in points[0].overrides if o in common)}",
        flush=True,
    )
    env = worker_env(study, store.parent_id if store else None, jobs)
    counts = {"finished": 0, "failed": 0, "skipped": skipped}
    started, status = time.perf_counter(), "FINISHED"
    try:
        run_all(todo, runner, env, folders, resumed, store, common, counts)
    except KeyboardInterrupt:
        status = "KILLED"
        print(f"{title}: interrupted; runs in progress end KILLED, the rest did not start", file=sys.stderr)
        raise
    finally:
        runner.close()
        if store:
            store.end(counts, status if status == "KILLED" else ("FAILED" if counts["failed"] else "FINISHED"))
    minutes = (time.perf_counter() - started) / 60
    print(
        f"{title}: {counts['finished']} finished, {counts['failed']} failed, {counts['skipped']} skipped "
        f"in {minutes:.1f} min" + (f"; table: rlx report --study {study} --stats" if store else "")
    )
    return 1 if counts["failed"] else 0


def print_table(study: str, folder: Path, title: str) -> None:
    """The study's table with verdicts, written to ``folder``; why there is none when the runs cannot give one."""
    from rlx_cli.studies.report import study_report

    try:
        text, paths = study_report(study, folder)
    except UserError as error:
        print(f"{title}: no table: {error}", flush=True)
        return
    print(f"\n{text}\n" + "".join(f"wrote {path}\n" for path in paths), end="", flush=True)


def pending(points: list[Point], folders: dict[int, Path], store: Study | None, rerun: bool, say) -> list[Point]:
    """The points this launch runs: all but the FINISHED ones (with ``--rerun`` all, their old folders moved aside).

    First what an earlier launch left RUNNING is settled (``Study.settle``).
    """
    if store is None:  # without MLflow, a point's final metrics.json says it finished
        done = {p.key for p in points if (folders[p.index] / "metrics.json").is_file()}
    else:
        store.settle(say)
        done = store.finished()
    if rerun:
        for point in points:
            if point.key in done:
                retire(folders[point.index])
        done = set()
    return [p for p in points if p.key not in done]


def run_all(todo, runner, env: dict, folders: dict, resumed: set, store, common: set, counts: dict) -> None:
    """Up to ``--jobs`` points at once; each result is recorded and printed as it comes in."""
    pool = ThreadPoolExecutor(max_workers=runner.jobs)
    futures = {}
    try:
        for point in todo:
            folder = folders[point.index]
            overrides = worker_overrides(point, folder)
            log, lock = (folder / "worker.log").resolve(), (folder / WORKER_LOCK).resolve()
            job_env = {**env, "RLX_ARM": point.arm} if point.arm else env
            job = Job([sys.executable, "-m", "rlx_cli", "train", *overrides], job_env, os.getcwd(), str(log), str(lock))
            since_ms = int(time.time() * 1000)
            futures[pool.submit(timed, runner.call, job)] = (point, overrides, log, since_ms)
        for n, future in enumerate(as_completed(futures), 1):
            point, overrides, log, since_ms = futures[future]
            try:
                returncode, seconds = future.result()
            except Exception as error:  # noqa: BLE001 - a launcher failure fails this point only
                returncode, seconds = -1, 0.0
                log.parent.mkdir(parents=True, exist_ok=True)
                with log.open("a") as out:
                    out.write(f"launcher error: {type(error).__name__}: {error}\n")
            error = last_line(log) if returncode else ""
            result = store.record(point, overrides, returncode, error, since_ms) if store else None
            result = result or ("FINISHED" if returncode == 0 else "FAILED")
            counts["finished" if result == "FINISHED" else "failed"] += 1
            detail = f"  ({seconds:.0f} s)" if result == "FINISHED" else f"  exit {returncode}: {error}  [{log}]"
            shown = " ".join(o for o in point.overrides if o not in common) or " ".join(point.overrides)
            shown = f"{point.arm} seed={point.seed}" if point.arm else shown  # a declared study's arm by its name
            went_on = " (from its checkpoint)" if point.index in resumed else ""
            print(f"[{n}/{len(todo)}] {result:<8} {shown}{went_on}{detail}", flush=True)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)  # points not started yet never start
        runner.interrupt()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def timed(call, job: Job) -> tuple[int, float]:
    started = time.perf_counter()
    return call(job), time.perf_counter() - started


def digest(args: list[str]) -> str:
    return hashlib.sha256(" ".join(sorted(args)).encode()).hexdigest()[:6]


def sweep_command(args: list[str], *, jobs: int = 1, launcher: str = "local", study: str | None = None,
                  dry_run: bool = False, rerun: bool = False, report: bool = True) -> int:  # fmt: skip
    """``rlx sweep``: the default study name is ``<algo>-sweep-<hash of the arguments>``, stable across re-runs."""
    if jobs < 1:
        raise UserError(f"--jobs {jobs} is not valid (valid: 1 or more)")
    check_launcher(launcher)
    points = plan(expand(args))
    study = study or f"{points[0].algo}-sweep-{digest(args)}"
    command = " ".join(["rlx sweep", *args])
    return execute(points, study, jobs=jobs, launcher=launcher, dry_run=dry_run, rerun=rerun, command=command,
                   report=report)  # fmt: skip


def ablate_points(args: list[str], seeds: int) -> list[list[str]]:
    """Each base point, then the base with each applicable overlay; K seeds each (or the given ``seed=``)."""
    if seeds < 1:
        raise UserError(f"--seeds {seeds} is not valid (valid: 1 or more)")
    if any(key_of(a) == "ablate" for a in args):
        raise UserError("rlx ablate adds each +ablate=NAME overlay itself (pass the preset, e.g. algo=vapo)")
    seed_args = [a for a in args if key_of(a) == SEED_KEY]
    seed_values = [p[0] for p in expand(seed_args)] if seed_args else [f"seed={s}" for s in range(seeds)]
    points, overlays = [], {}
    for base in expand([a for a in args if key_of(a) != SEED_KEY]):
        overlays.setdefault(tuple(base), applicable_overlays(base))
        for arm in [[]] + [[f"+ablate={name}"] for name in overlays[tuple(base)]]:
            points += [[*base, *arm, seed] for seed in seed_values]
    return points


def ablate_command(args: list[str], *, seeds: int = 3, jobs: int = 1, launcher: str = "local", study: str | None = None,
                   dry_run: bool = False, rerun: bool = False, report: bool = True) -> int:  # fmt: skip
    """``rlx ablate``: study and experiment default to ``<algo>-ablation``."""
    if jobs < 1:
        raise UserError(f"--jobs {jobs} is not valid (valid: 1 or more)")
    check_launcher(launcher)
    algos = list(dict.fromkeys(str(choices_of(compose(base))["algo"]) for base in expand(args)))
    name = f"{'-'.join(algos)}-ablation"
    if not any(key_of(a) == "tracking.experiment" for a in args):
        args = [*args, f"tracking.experiment={study or name}"]
    points = plan(ablate_points(args, seeds))
    command = " ".join(["rlx ablate", *args, f"--seeds {seeds}"])
    return execute(
        points,
        study or name,
        jobs=jobs,
        launcher=launcher,
        dry_run=dry_run,
        rerun=rerun,
        command=command,
        title="rlx ablate",
        report=report,
    )
