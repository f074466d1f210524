"""A study on disk and in MLflow: the stable folder of each point, who is alive, the runs of each point.

- **A point's folder** is ``outputs/sweeps/<study>/<algo>[+<ablate>]-s<seed>-<hash>`` (``D/<study>/...`` when the
  sweep is given ``trainer.output_dir=D``); the hash is of the point's overrides (their order, the output folder and
  ``trainer.resume`` aside). The same command finds the same folders again, and every point runs with
  ``trainer.resume=true``: one with a checkpoint goes on from it into its own MLflow run (the checkpoint holds the
  run id), one without starts fresh.
- **Who is alive** (``locks``): the driver (``rlx sweep`` / ``rlx ablate``) holds ``<study folder>/.driver.lock``,
  each point's ``rlx train`` holds ``<point folder>/.worker.lock`` (the launcher takes it and hands it down). A run
  still RUNNING in MLflow whose lock nobody holds lost its worker without ending the run.
- **``study.json``** in the study folder lists the points of every launch, so that ``rlx status`` knows the points
  that have no run yet; the parent run's tag ``rlx.study_dir`` says where the folder is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rlx_cli.config import locks
from rlx_cli.config.errors import UserError
from rlx_cli.loops.track import git_sha, tracking_uri

SEED_KEY, OUTPUT_KEY, RESUME_KEY = "seed", "trainer.output_dir", "trainer.resume"
STUDY_ROLE = "study"  # tag rlx.role of a study's parent run; `rlx report` leaves those out
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
SWEEPS = Path("outputs") / "sweeps"
DRIVER_LOCK, WORKER_LOCK, MANIFEST = ".driver.lock", ".worker.lock", "study.json"


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def override_tokens(tag: str) -> list[str]:
    """A run's ``rlx.overrides`` tag -> its overrides. The tag is shell-quoted (``shlex.join``), so an override that
    holds spaces (``'task.config={min_terms: 2, max_terms: 3}'``) stays one; a tag that does not parse as shell
    words (one written before the quoting, with an apostrophe in a value) splits at spaces."""
    try:
        return shlex.split(tag)
    except ValueError:
        return tag.split()


def quoted(override: str) -> str:
    """An override as a shell would need it on a command line (quoted only when it holds whitespace)."""
    return shlex.quote(override) if any(c.isspace() for c in override) else override


def canonical_tokens(overrides: list[str] | str) -> list[str]:
    """A point's overrides (a list, or a run's tag) sorted, without the output folder and ``trainer.resume``."""
    tokens = override_tokens(overrides) if isinstance(overrides, str) else overrides
    return sorted(t for t in tokens if key_of(t) not in (OUTPUT_KEY, RESUME_KEY))


def canonical(overrides: list[str] | str) -> str:
    """A point's identity: ``canonical_tokens`` as one string."""
    return " ".join(canonical_tokens(overrides))


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its overrides and what the study records of it."""

    index: int
    overrides: list[str]
    algo: str
    ablate: str
    seed: int
    experiment: str
    tracked: bool
    steps: int
    arm: str = ""  # a declared study's name for the point's arm (its runs' tag rlx.arm)

    @property
    def key(self) -> str:
        return canonical(self.overrides)


def point_folder(point: Point, study: str) -> Path:
    """``<root>/<study>/<algo>[+<ablate>]-s<seed>-<hash of the point's identity>``; root ``outputs/sweeps`` or the
    sweep's own ``trainer.output_dir``."""
    given = [o.split("=", 1)[1] for o in point.overrides if key_of(o) == OUTPUT_KEY]
    ablate = "" if point.ablate == "none" else "+" + point.ablate.replace(",", "+")
    digest = hashlib.sha256(point.key.encode()).hexdigest()[:8]
    return (Path(given[-1]) if given else SWEEPS) / study / f"{point.algo}{ablate}-s{point.seed}-{digest}"


def worker_overrides(point: Point, folder: Path) -> list[str]:
    """The point's overrides for its ``rlx train``: its own folder, and a resume from its checkpoint if it has one."""
    rest = [o for o in point.overrides if key_of(o) not in (OUTPUT_KEY, RESUME_KEY)]
    return [*rest, f"{OUTPUT_KEY}={folder}", f"{RESUME_KEY}=true"]


def output_folder(overrides: str) -> Path | None:
    """The ``trainer.output_dir`` in a run's ``rlx.overrides`` tag."""
    given = [t.split("=", 1)[1] for t in override_tokens(overrides) if key_of(t) == OUTPUT_KEY]
    return Path(given[-1]) if given else None


def last_checkpoint_step(folder: Path) -> int | None:
    """The step of the newest complete checkpoint in a point's folder (without importing torch)."""
    names = [p.parent.name[5:] for p in folder.glob("checkpoints/step-*/state.json")]
    steps = [int(name) for name in names if name.isdigit()]
    return max(steps) if steps else None


@contextmanager
def driver_lock(home: Path, study: str):
    """One driver per study at a time: a second launch while the first lives is a one-line error."""
    fd = locks.take(home / DRIVER_LOCK)
    if fd is None:
        raise UserError(
            f"study '{study}' is being run by another rlx sweep/ablate (it holds {home / DRIVER_LOCK}); "
            f"wait for it to end, or follow it with: rlx status --study {study}"
        )
    try:
        yield
    finally:
        os.close(fd)


def record_points(home: Path, study: str, points: list[Point], folders: dict[int, Path]) -> None:
    """Add this launch's points to ``study.json`` (a study may grow over several commands)."""
    known = read_points(home)
    for point in points:
        known[point.key] = {"overrides": point.overrides, "folder": str(folders[point.index].resolve()),
                            "steps": point.steps, "arm": point.arm}  # fmt: skip
    tmp = home / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"study": study, "points": known}, indent=1))
    tmp.replace(home / MANIFEST)


def read_points(home: Path) -> dict[str, dict]:
    """key -> {overrides, folder (absolute), steps} of every point launched in the study so far."""
    path = home / MANIFEST
    return json.loads(path.read_text())["points"] if path.is_file() else {}


def retire(folder: Path) -> None:
    """``--rerun`` of a FINISHED point: its folder moves aside (kept), the new run starts in a fresh one."""
    if folder.exists():
        folder.rename(folder.with_name(f"{folder.name}.{datetime.now():%Y-%m-%d_%H-%M-%S}"))


class Study:
    """The study's parent run in its experiment and the child runs it holds; used in the driver only."""

    def __init__(self, name: str, experiment: str, command: str, home: Path, jobs: int):
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
        self.client.set_tag(self.parent_id, "rlx.study_dir", str(home.resolve()))  # where `rlx status` looks
        self.client.set_tag(self.parent_id, "rlx.jobs", str(jobs))

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

    def newest(self, key: str):
        """The point's latest run (a resumed run keeps its start; a run started after a dead one is newer)."""
        mine = [r for r in self.children() if canonical(r.data.tags["rlx.overrides"]) == key]
        return max(mine, key=lambda r: r.info.start_time) if mine else None

    def settle(self, say) -> None:
        """Runs left RUNNING by an earlier launch: wait for those whose worker still lives (it stops within a step
        when its driver died), then mark the rest KILLED: their worker died before it could end them."""

        def alive(run) -> bool:
            folder = output_folder(run.data.tags["rlx.overrides"])
            return folder is not None and locks.held(folder / WORKER_LOCK)

        running = [r for r in self.children() if r.info.status == "RUNNING"]
        live = [r for r in running if alive(r)]
        if live:
            folders = ", ".join(str(output_folder(r.data.tags["rlx.overrides"])) for r in live)
            say(f"waiting for an earlier launch's workers to stop ({len(live)}; they hold the locks in {folders})")
            while any(alive(r) for r in live):
                time.sleep(1)
            running = [r for r in self.children() if r.info.status == "RUNNING"]
        for run in running:
            reason = f"its worker died without ending the run (found RUNNING at the launch of {datetime.now():%c})"
            self.client.set_tag(run.info.run_id, "rlx.error", reason)
            self.client.set_terminated(run.info.run_id, "KILLED")
        if running:
            say(f"marked KILLED: {len(running)} run{'s' * (len(running) != 1)} left RUNNING by workers that died")

    def record(self, point: Point, overrides: list[str], returncode: int, error: str, since_ms: int) -> str:
        """The point's final status after its worker exited; a run it left RUNNING, or never reached, is FAILED.

        ``since_ms``: when the attempt was submitted; a run neither started nor ended since then was not touched by
        it (the worker failed before it resumed or opened its run).
        """
        run = self.newest(point.key)
        touched = run is not None and (
            run.info.status == "RUNNING" or max(run.info.start_time, run.info.end_time or 0) >= since_ms
        )
        if touched and run.info.status != "RUNNING":
            return run.info.status
        if run is None or (not touched and run.info.status == "FINISHED"):  # failed before its run existed
            tags = {
                "rlx.algo": point.algo, "rlx.ablate": point.ablate, "rlx.overrides": shlex.join(overrides),
                "rlx.study": self.name, "rlx.seed": str(point.seed), "rlx.git_sha": git_sha(),
                "mlflow.parentRunId": self.parent_id,
            }  # fmt: skip
            run = self.client.create_run(self.experiment_id, run_name=f"{point.algo}-s{point.seed}", tags=tags)
        self.client.set_tag(run.info.run_id, "rlx.error", (error or f"exit code {returncode}")[:5000])
        self.client.set_terminated(run.info.run_id, "FAILED")
        return "FAILED"

    def end(self, counts: dict[str, int], status: str) -> None:
        for name, value in counts.items():
            self.client.log_metric(self.parent_id, f"sweep/{name}", value)
        self.client.set_terminated(self.parent_id, status)
