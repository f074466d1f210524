"""``rlx sweep`` and ``rlx ablate``: a grid in Hydra's multirun syntax, one ``rlx train`` per point.

1. expand the overrides with Hydra's own parser and BasicSweeper (``a,b``, ``range()``, ``choice()``, ``glob()``)
2. compose and validate every point here, so a typo fails before anything runs or is written
3. open the MLflow store, the experiment and the study's parent run here, before any worker does
   (workers that create a fresh SQLite store at the same moment race on its schema)
4. skip the points the study already FINISHED (``--rerun`` runs them again)
5. run each point as ``python -m rlx_cli train ...`` through a launcher, ``--jobs`` at a time; every run
   is a child of the study's parent run (``RLX_PARENT_RUN_ID``) tagged ``rlx.study`` (``RLX_STUDY``)
6. a point that failed before its run existed, or was killed hard, is still recorded FAILED; then a summary
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rlx_cli.compose import CONFIG_MODULE, choices_of, compose, explain, group_choices
from rlx_cli.errors import UserError
from rlx_cli.launchers import Job, check_launcher, make_launcher
from rlx_cli.track import git_sha, tracking_uri

SEED_KEY, OUTPUT_KEY = "seed", "trainer.output_dir"
STUDY_ROLE = "study"  # tag rlx.role of a study's parent run; `rlx report` leaves those out
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def canonical(overrides: list[str] | str) -> str:
    """A point's identity: its override tokens sorted, without the output directory (new on every launch)."""
    text = overrides if isinstance(overrides, str) else " ".join(overrides)
    return " ".join(sorted(t for t in text.split() if key_of(t) != OUTPUT_KEY))


def expand(args: list[str]) -> list[list[str]]:
    """Hydra multirun expansion: ``["a=1,2", "b=x"]`` -> ``[["a=1", "b=x"], ["a=2", "b=x"]]``."""
    from hydra import initialize_config_module
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
            (points,) = BasicSweeper.split_arguments(parser.parse_overrides(list(args)), None)
    except OverrideParseException as error:
        first = str(error).splitlines()[0]
        raise UserError(f"cannot parse override '{error.override}': {first} (sweeps: key=a,b · range())") from None
    except HydraException as error:
        if "does not support sweep type" in str(error):
            valid = "a,b,c · range() · choice() · glob()"
            raise UserError(f"interval() cannot be enumerated (valid sweeps: {valid})") from None
        raise UserError(explain(str(error), list(args))) from None
    finally:
        GlobalHydra.instance().clear()
    return points


@dataclass(frozen=True)
class Point:
    index: int
    overrides: list[str]
    algo: str
    ablate: str
    seed: int
    experiment: str
    tracked: bool

    @property
    def key(self) -> str:
        return canonical(self.overrides)


def plan(points: list[list[str]]) -> list[Point]:
    """Compose and validate every point; all of them must log to one experiment."""
    from rlx_cli.run import ablations
    from rlx_cli.validate import validate

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
        planned.append(Point(index, overrides, str(choices["algo"]), ablate, int(cfg.seed), experiment, tracked))
    where = sorted({(p.experiment if p.tracked else "tracking=none") for p in planned})
    if len(where) > 1:
        raise UserError(f"all points of a sweep log to one experiment, these go to: {', '.join(where)}")
    return planned


class Study:
    """The study's parent run in its experiment, and the child runs it already holds; used in this process only."""

    def __init__(self, name: str, experiment: str, command: str):
        import logging

        import mlflow
        from mlflow.tracking import MlflowClient

        for noisy in ("alembic", "mlflow"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        self.mlflow, self.name = mlflow, name
        mlflow.set_tracking_uri(tracking_uri())
        self.client = MlflowClient()
        try:
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        except Exception as error:  # noqa: BLE001 - any store failure comes from the user's URI
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UserError(f"MLFLOW_TRACKING_URI={tracking_uri()} is not usable: {first}") from error
        parents = [r for r in self.runs() if r.data.tags.get("rlx.role") == STUDY_ROLE]
        if parents:  # a re-run of the study: its children stay under the same parent
            self.parent_id = parents[0].info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            tags = {"rlx.study": name, "rlx.role": STUDY_ROLE, "rlx.command": command, "rlx.git_sha": git_sha()}
            self.parent_id = self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def runs(self) -> list:
        return self.mlflow.search_runs(
            experiment_ids=[self.experiment_id],
            filter_string=f"tags.`rlx.study` = '{self.name}'",
            output_format="list",
        )

    def children(self) -> list:
        return [r for r in self.runs() if r.data.tags.get("rlx.role") != STUDY_ROLE and "rlx.overrides" in r.data.tags]

    def finished(self) -> set[str]:
        return {canonical(r.data.tags["rlx.overrides"]) for r in self.children() if r.info.status == "FINISHED"}

    def record(self, point: Point, overrides: list[str], returncode: int, error: str) -> str:
        """The final status of the point's run; a run left RUNNING, or missing, becomes FAILED."""
        tag = " ".join(overrides)
        mine = [r for r in self.children() if r.data.tags["rlx.overrides"] == tag]
        run = max(mine, key=lambda r: r.info.start_time) if mine else None
        if returncode == 0 and run is not None:
            return run.info.status
        if run is not None and run.info.status != "RUNNING":
            return run.info.status
        if run is None:  # it failed before `rlx train` opened its run
            tags = {
                "rlx.algo": point.algo, "rlx.ablate": point.ablate, "rlx.overrides": tag, "rlx.study": self.name,
                "rlx.seed": str(point.seed), "rlx.git_sha": git_sha(), "mlflow.parentRunId": self.parent_id,
            }  # fmt: skip
            run = self.client.create_run(self.experiment_id, run_name=f"{point.algo}-s{point.seed}", tags=tags)
        self.client.set_tag(run.info.run_id, "rlx.error", (error or f"exit code {returncode}")[:5000])
        self.client.set_terminated(run.info.run_id, "FAILED")
        return "FAILED"

    def end(self, counts: dict[str, int], status: str) -> None:
        for name, value in counts.items():
            self.client.log_metric(self.parent_id, f"sweep/{name}", value)
        self.client.set_terminated(self.parent_id, status)


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


def with_output_dir(point: Point, sweep_dir: Path) -> list[str]:
    """The point's overrides plus an output directory of its own (parallel runs must not share one).

    ``sweep_dir`` is ``outputs/sweeps/<study>/<date>_<time>``; a given ``trainer.output_dir=D`` becomes
    ``D/<date>_<time>/<index>``, so a re-run never lands on an earlier run's checkpoints.
    """
    given = [o for o in point.overrides if key_of(o) == OUTPUT_KEY]
    base = f"{given[-1].split('=', 1)[1]}/{sweep_dir.name}" if given else str(sweep_dir)
    rest = [o for o in point.overrides if key_of(o) != OUTPUT_KEY]
    return [*rest, f"{OUTPUT_KEY}={base}/{point.index:03d}"]


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
) -> int:
    """Run the planned points; returns the exit code (0: none failed, 1: some failed)."""
    if not STUDY_NAME.match(study):
        raise UserError(f"--study '{study}' is not a valid name (valid: letters, digits, '_', '-', '.')")
    experiment = points[0].experiment if points[0].tracked else None
    where = f"experiment '{experiment}' at {tracking_uri()}" if experiment else "tracking=none"
    if dry_run:
        print(f"{title}: {len(points)} run{'s' * (len(points) != 1)} in study '{study}', {where}")
        for point in points:
            print(f"  {point.index:03d}  {' '.join(point.overrides)}")
        return 0
    check_launcher(launcher)
    store = Study(study, experiment, command) if experiment else None
    done = store.finished() if store and not rerun else set()
    todo = [p for p in points if p.key not in done]
    skipped = len(points) - len(todo)
    sweep_dir = Path("outputs") / "sweeps" / study / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    runner = make_launcher(launcher, jobs, sweep_dir)
    common = set.intersection(*(set(p.overrides) for p in points))
    print(
        f"{title}: study '{study}': {len(todo)} to run, {skipped} skipped (already FINISHED), "
        f"{runner.describe()}; {where}; logs in {sweep_dir}\n"
        f"common overrides: {' '.join(o for o in points[0].overrides if o in common)}",
        flush=True,
    )
    env = worker_env(study, store.parent_id if store else None, jobs)
    counts, started, status = {"finished": 0, "failed": 0, "skipped": skipped}, time.perf_counter(), "FINISHED"
    try:
        run_all(todo, runner, env, sweep_dir, store, common, counts)
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
        f"in {minutes:.1f} min" + (f"; table: rlx report --study {study}" if store else "")
    )
    return 1 if counts["failed"] else 0


def run_all(todo: list[Point], runner, env: dict, sweep_dir: Path, store, common: set, counts: dict) -> None:
    """Up to ``--jobs`` points at once; each result is recorded and printed as it comes in."""
    pool = ThreadPoolExecutor(max_workers=runner.jobs)
    futures = {}
    try:
        for point in todo:
            overrides = with_output_dir(point, sweep_dir)
            log = (sweep_dir / f"{point.index:03d}.log").resolve()
            job = Job([sys.executable, "-m", "rlx_cli", "train", *overrides], env, os.getcwd(), str(log))
            futures[pool.submit(timed, runner.call, job)] = (point, overrides, log)
        for n, future in enumerate(as_completed(futures), 1):
            point, overrides, log = futures[future]
            try:
                returncode, seconds = future.result()
            except Exception as error:  # noqa: BLE001 - a launcher failure fails this point only
                returncode, seconds = -1, 0.0
                log.parent.mkdir(parents=True, exist_ok=True)
                with log.open("a") as out:
                    out.write(f"launcher error: {type(error).__name__}: {error}\n")
            error = last_line(log) if returncode else ""
            result = store.record(point, overrides, returncode, error) if store else None
            result = result or ("FINISHED" if returncode == 0 else "FAILED")
            counts["finished" if result == "FINISHED" else "failed"] += 1
            detail = f"  ({seconds:.0f} s)" if result == "FINISHED" else f"  exit {returncode}: {error}  [{log}]"
            shown = " ".join(o for o in point.overrides if o not in common) or " ".join(point.overrides)
            print(f"[{n}/{len(todo)}] {result:<8} {shown}{detail}", flush=True)
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
                  dry_run: bool = False, rerun: bool = False) -> int:  # fmt: skip
    """``rlx sweep``: the default study name is ``<algo>-sweep-<hash of the arguments>``, stable across re-runs."""
    if jobs < 1:
        raise UserError(f"--jobs {jobs} is not valid (valid: 1 or more)")
    check_launcher(launcher)
    points = plan(expand(args))
    study = study or f"{points[0].algo}-sweep-{digest(args)}"
    command = " ".join(["rlx sweep", *args])
    return execute(points, study, jobs=jobs, launcher=launcher, dry_run=dry_run, rerun=rerun, command=command)


def applicable_overlays(base: list[str]) -> list[str]:
    """The ``conf/ablate/`` overlays that compose and validate on top of ``base``."""
    from rlx_cli.validate import validate

    names = []
    for name in group_choices().get("ablate", []):
        try:
            validate(compose([*base, f"+ablate={name}"]))
        except UserError:
            continue
        names.append(name)
    return names


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


def ablate_command(args: list[str], *, seeds: int = 3, jobs: int = 1, launcher: str = "local",
                   study: str | None = None, dry_run: bool = False, rerun: bool = False) -> int:  # fmt: skip
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
    )
