"""A study whose driver (and one worker) is SIGKILLed mid-way and launched again, against the same points run without
a stop."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import mlflow_runs, rlx

from rlx_cli.config import locks
from rlx_cli.studies.study import WORKER_LOCK

# 2 lengths x 3 seeds, a checkpoint every step; with two jobs a short point and a long one run side by side, so
# when the short one ends the long one has steps to go
GRID = ["algo=grpo", "trainer.steps=3,16", "seed=0,1,2", "trainer.ckpt_every=1", "trainer.eval_every=0",
        "rollout.prompts_per_step=4", "task.eval_size=20", "trainer.threads=1"]  # fmt: skip
STUDY = [*GRID, "--jobs", "2", "--study", "cut"]


def in_store(folder: Path):
    """Point MLflow (and the ``rlx`` subprocesses) at ``folder``'s store."""
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"


def workers_of(pid: int) -> dict[str, tuple[int, int]]:
    """The worker processes of a driver, by the name of their point's folder: (pid, trainer.steps), from Linux's
    /proc."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])  # after "pid (name) state"
            argv = (proc / "cmdline").read_bytes().decode().split("\0") if parent == pid else []
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that just ended
        value = dict(a.split("=", 1) for a in argv if "=" in a)
        if "trainer.output_dir" in value:
            found[Path(value["trainer.output_dir"]).name] = (int(proc.name), int(value["trainer.steps"]))
    return found


def store_is_free(db: Path) -> bool:
    """Whether no process holds a lock on the SQLite store ``db`` (a process frozen inside a transaction would
    keep every other from writing): an exclusive transaction opens at once."""
    import sqlite3

    connection = sqlite3.connect(db, timeout=0.05)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        connection.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        connection.close()


def freeze(pid: int, db: Path) -> bool:
    """Stop process ``pid`` (SIGSTOP) -> whether it stays stopped: not if it holds a lock on the store ``db``
    (stopped inside a transaction), then it goes on (SIGCONT) to be tried again."""
    os.kill(pid, signal.SIGSTOP)
    if store_is_free(db):
        return True
    os.kill(pid, signal.SIGCONT)
    return False


def kill_mid_way(workdir: Path) -> tuple[list[str], str, str]:
    """Launch the study; once a point has ended and another runs with a checkpoint and steps to go, freeze that one
    (SIGSTOP) until the point launched next runs too; then SIGKILL the new one's worker (a lost process: its run
    stays RUNNING) and the driver, and let the frozen one go on (SIGCONT): the driver's death sends it SIGTERM, it
    checkpoints and ends KILLED -> (the states ``rlx status`` saw just before the kill, the two folders' names).

    Freezing makes the moment certain: the next point's start-up takes seconds, which the steps to go of a point
    started beside the one that ended do not always last."""
    from rlx_cli.studies.status import gather
    from rlx_cli.studies.study import last_checkpoint_step

    driver = subprocess.Popen([sys.executable, "-m", "rlx_cli", "sweep", *STUDY], cwd=workdir, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    home, deadline, frozen = workdir / "outputs" / "sweeps" / "cut", time.monotonic() + 300, None
    while time.monotonic() < deadline and driver.poll() is None:
        folders = [f for f in home.glob("grpo-*") if f.is_dir()]
        if frozen is None and any((f / "metrics.json").exists() for f in folders):
            mid = [(name, pid) for name, (pid, steps) in workers_of(driver.pid).items()
                   if (last_checkpoint_step(home / name) or 0) in range(1, steps)]  # fmt: skip
            frozen = mid[0] if mid and freeze(mid[0][1], workdir / "mlflow.db") else None
        if frozen is not None:
            states = [p.state for p in gather("cut").points]
            workers = workers_of(driver.pid) if "finished" in states and states.count("running") == 2 else {}
            lost = next((name for name in workers if name != frozen[0]), None)
            if lost:
                os.kill(workers[lost][0], signal.SIGKILL)
                os.kill(driver.pid, signal.SIGKILL)
                driver.wait()
                os.kill(frozen[1], signal.SIGCONT)  # the SIGTERM of its parent's death is waiting for it
                while any(locks.held(f / WORKER_LOCK) for f in folders) and time.monotonic() < deadline:
                    time.sleep(0.02)  # the workers are gone once the kernel let go of their locks
                return states, frozen[0], lost
        time.sleep(0.02)
    os.killpg(driver.pid, signal.SIGKILL)
    raise AssertionError("the study ended (or hung) before it could be killed mid-way")


def histories(run_id: str) -> dict[str, list[tuple[int, float]]]:
    """metric -> every stored (step, value), perf/* aside: a step stored twice shows as two entries."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("perf/")]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def by_point(workdir: Path) -> dict[str, list]:
    from rlx_cli.studies.study import canonical

    runs = mlflow_runs(workdir)
    children = runs[runs["tags.rlx.role"] != "study"] if "tags.rlx.role" in runs else runs  # no parent: no such tag
    return {key: group for key, group in children.groupby(children["tags.rlx.overrides"].map(canonical))}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal and /proc are Linux's")
def test_a_killed_study_launched_again_ends_as_if_never_stopped(tmp_path, monkeypatch):
    """Acceptance 2: 6 points, 2 jobs; the driver SIGKILLed mid-way with one worker (the other stops by itself);
    the same command again; then the two stopped points run without a stop."""
    from rlx_cli.studies.report import report_command
    from rlx_cli.studies.status import gather

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    for folder in (straight, cut):
        folder.mkdir()
    monkeypatch.chdir(cut)
    in_store(cut)
    before, stopped, lost = kill_mid_way(cut)
    assert before.count("running") == 2 and "pending" in before, before
    after = {p.label: p for p in gather("cut").points}
    notes = sorted(p.note for p in after.values() if p.state == "stopped")
    assert [p.state for p in after.values()].count("stopped") == 2 and "pending" in {p.state for p in after.values()}
    assert notes[0].startswith("goes on from its step-") and notes[1].startswith("its worker is gone; "), notes

    again = rlx("sweep", *STUDY, cwd=cut)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "marked KILLED: 1 run left RUNNING" in again.stdout, again.stdout  # the lost worker's
    log = (cut / "outputs" / "sweeps" / "cut" / stopped / "worker.log").read_text()
    assert "(from its checkpoint)" in again.stdout and "resuming from" in log.rsplit("\n--- ", 1)[1]
    finished = int(again.stdout.split(" skipped (already FINISHED)")[0].rsplit(" ", 1)[1])
    assert finished >= 1 and "6 finished" not in again.stdout
    assert [p.state for p in gather("cut").points] == ["finished"] * 6

    # the two points that were stopped, run to their end without a stop: what each of their workers runs, one after
    # the other in this process (saving start-ups), in a copy of the study's store where their runs are deleted; so
    # the copy holds the study as if it had never been stopped (the four other points ran without a stop in it)
    from mlflow.tracking import MlflowClient

    from rlx_cli.loops.run import train_command
    from rlx_cli.studies.study import point_folder, worker_overrides
    from rlx_cli.studies.sweep import expand, plan

    grid = plan(expand(GRID))
    halted = [p for p in grid if point_folder(p, "cut").name in (stopped, lost)]
    assert len(halted) == 2 and stopped != lost
    source, copy = sqlite3.connect(cut / "mlflow.db"), sqlite3.connect(straight / "mlflow.db")
    source.backup(copy)
    source.close()
    copy.close()
    monkeypatch.chdir(straight)
    monkeypatch.setenv("RLX_STUDY", "cut")
    in_store(straight)
    for point in halted:
        for run_id in by_point(straight)[point.key]["run_id"]:
            MlflowClient().delete_run(run_id)
        train_command(worker_overrides(point, point_folder(point, "cut")))

    reference = by_point(straight)
    assert all(len(reference[p.key]) == 1 for p in halted)  # the copy's runs of a stopped point are gone
    expected = {p.key: histories(reference[p.key].iloc[0]["run_id"]) for p in halted}
    in_store(cut)
    points = by_point(cut)
    assert set(points) == {p.key for p in grid} and len(points) == 6
    for point in grid:
        group = points[point.key]
        assert (group["status"] == "FINISHED").sum() == 1, (point.key, group["status"].tolist())  # exactly once
        assert "RUNNING" not in set(group["status"])
        run = group[group["status"] == "FINISHED"].iloc[0]
        stored = histories(run["run_id"])
        if point.key in expected:
            assert stored == expected[point.key]  # the same steps and values, each stored once
        else:  # it ran without a stop: each step once
            assert [step for step, _ in stored["train/reward"]] == list(range(1, point.steps + 1)), point.key
            assert all(len({step for step, _ in h}) == len(h) for h in stored.values()), point.key
    assert set(mlflow_runs(cut)["status"]) <= {"FINISHED", "KILLED"}  # none RUNNING, the parent run included

    for options in ({}, {"with_stats": True}):
        text = report_command(study="cut", **options)
        in_store(straight)
        assert report_command(study="cut", **options) == text
        in_store(cut)
