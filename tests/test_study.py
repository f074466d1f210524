"""Resumable studies: liveness locks, a killed driver's workers, runs left RUNNING, ``rlx status``; then a study
whose driver (and one worker) is SIGKILLed mid-way and launched again, against the same points run without a stop."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import mlflow_runs, rlx

from rlx_cli.config import locks
from rlx_cli.config.errors import UserError
from rlx_cli.studies.study import DRIVER_LOCK, WORKER_LOCK, Point, Study, point_folder, record_points

HOLD = (
    "import sys, time\nfrom pathlib import Path\nfrom rlx_cli.config import locks\nfd = locks.take(Path(sys.argv[1]))\n"
)


def holder(path: Path, seconds: float = 60) -> subprocess.Popen:
    """A process that holds the lock on ``path`` for ``seconds`` (it prints 'held' once it does)."""
    code = HOLD + f"print('held', flush=True)\ntime.sleep({seconds})\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_is_held_exactly_while_its_holder_lives(tmp_path):
    lock = tmp_path / "point" / WORKER_LOCK
    assert not locks.held(lock)  # no file: nobody
    proc = holder(lock)
    assert locks.held(lock) and locks.take(lock, wait=0.1) is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not locks.held(lock)  # the kernel let go when the holder died
    fd = locks.take(lock)
    assert fd is not None and locks.held(lock)
    os.close(fd)


def test_holding_a_lock_waits_for_its_holder_and_lets_go_on_leaving(tmp_path):
    """``locks.holding``: a fresh MLflow store's tables and a base model built by one process at a time."""
    lock, entered, leave = tmp_path / "store" / "one.lock", threading.Event(), threading.Event()
    proc = holder(lock)

    def hold():
        with locks.holding(lock):
            entered.set()
            leave.wait(30)

    waiter = threading.Thread(target=hold)
    waiter.start()
    assert not entered.wait(0.5)  # the other process holds it
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert entered.wait(30) and locks.held(lock)
    leave.set()
    waiter.join()
    assert not locks.held(lock)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_worker_gets_sigterm_and_keeps_its_lock_when_its_driver_is_sigkilled(tmp_path):
    """The launcher hands the point's lock down to the worker, which gets SIGTERM (checkpoint, KILLED) when the
    driver dies; until the worker exits the lock stays held, so the next launch waits for it."""
    worker = textwrap.dedent("""
        import signal, sys, time
        from pathlib import Path
        def stop(signum, frame):
            time.sleep(0.5)  # a step finishing, a checkpoint being written
            Path('stopped').write_text(str(signum))
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        Path('ready').write_text('1')
        time.sleep(60)
    """)
    lock = tmp_path / "point" / WORKER_LOCK
    driver = textwrap.dedent(f"""
        import sys
        from rlx_cli.studies.launchers import run_worker
        run_worker([sys.executable, "-c", {worker!r}], None, {str(tmp_path)!r}, {str(tmp_path / "w.log")!r},
                   lock={str(lock)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert locks.held(lock), "the worker holds the point's lock"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert locks.held(lock)  # the driver is gone, the worker still finishes its step
    while locks.held(lock) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "stopped").read_text() == str(int(signal.SIGTERM)) and not locks.held(lock)
    assert "--- " in (tmp_path / "w.log").read_text()  # the launch's header line in the appended log


def point(index: int, seed: int, *extra: str) -> Point:
    return Point(index, ["algo=grpo", f"seed={seed}", *extra], "grpo", "none", seed, "exp", True, 6)


def log_child(client, study: Study, p: Point, status: str, *, steps: int, error: str | None = None) -> str:
    """A child run of ``study`` for point ``p``, launched 20 s ago, that logged ``steps`` steps of 0.5 s, then
    ended ``status`` 20 s after its launch."""
    from datetime import datetime

    from mlflow.entities import Metric

    folder, started = point_folder(p, study.name), float(int(time.time()) - 20)  # whole seconds, as the log has
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "worker.log").write_text(f"--- {datetime.fromtimestamp(started):%Y-%m-%d %H:%M:%S}: rlx train ...\n")
    tags = {"rlx.overrides": " ".join([*p.overrides, f"trainer.output_dir={folder}", "trainer.resume=true"]),
            "rlx.study": study.name, "rlx.seed": str(p.seed), "rlx.algo": "grpo", "rlx.ablate": "none",
            "mlflow.parentRunId": study.parent_id}  # fmt: skip
    run_id = client.create_run(study.experiment_id, tags=tags, start_time=int(started * 1000) + 2000).info.run_id
    pairs = (("train/reward", 0.1), ("perf/step_s", 0.5))
    at = int(started * 1000) + 5000
    metrics = [Metric(key, value, at + 500 * step, step) for step in range(1, steps + 1) for key, value in pairs]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    if error:
        client.set_tag(run_id, "rlx.error", error)
    if status != "RUNNING":
        client.set_terminated(run_id, status, end_time=int(started * 1000) + 20_000)
    return run_id


@pytest.fixture
def study(workdir):
    """A study 'st' of 6 points in ``workdir``'s store, its study.json written, no child runs yet."""
    points = [point(i, i) for i in range(6)]
    folders = {p.index: point_folder(p, "st") for p in points}
    home = folders[0].parent
    home.mkdir(parents=True)
    record_points(home, "st", points, folders)
    store = Study("st", "exp", "rlx sweep ...", home, jobs=2)
    return store, points, home


def test_status_labels_keep_an_override_with_spaces_whole():
    """A point's label is the overrides that set it apart, each whole and quoted as a shell needs it (task=gym's
    difficulty is one override with spaces); a point like every other is labelled by all of its own."""
    from rlx_cli.studies.status import point_labels

    easy, hard = "task.config={min_terms: 2, max_terms: 3}", "task.config={min_terms: 3, max_terms: 4}"
    points = {
        "a": ["algo=grpo", easy, "seed=0"],
        "b": ["algo=grpo", hard, "seed=0"],
        "c": ["algo=grpo", easy, "seed=1"],
    }
    assert point_labels(points) == {
        "a": f"'{easy}' seed=0",
        "b": f"'{hard}' seed=0",
        "c": f"'{easy}' seed=1",
    }
    assert point_labels({"a": ["algo=grpo", easy]}) == {"a": f"algo=grpo '{easy}'"}
    assert point_labels({}) == {}


def test_status_shows_each_state(study, capsys):
    """Acceptance 3: finished, running (step x of y), stopped (worker gone / KILLED), failed and pending."""
    from rlx_cli.studies.status import gather, status_command

    store, points, home = study
    client = store.client
    log_child(client, store, points[0], "FINISHED", steps=6)
    log_child(client, store, points[1], "RUNNING", steps=2)  # its worker lives
    log_child(client, store, points[2], "RUNNING", steps=3)  # its worker died without ending the run
    log_child(client, store, points[3], "KILLED", steps=1)
    log_child(client, store, points[4], "FAILED", steps=4, error="Traceback ...\nRuntimeError: out of memory")
    checkpoint = point_folder(points[2], "st") / "checkpoints" / "step-000003"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text("{}")
    worker = holder(point_folder(points[1], "st") / WORKER_LOCK)
    driver = locks.take(home / DRIVER_LOCK)
    try:
        status = gather("st")
        assert [(p.label, p.state, p.step) for p in status.points] == [
            ("seed=0", "finished", 6),
            ("seed=1", "running", 2),
            ("seed=2", "stopped", 3),
            ("seed=3", "stopped", 1),
            ("seed=4", "failed", 4),
            ("seed=5", "pending", 0),
        ]
        assert status.driver and status.jobs == 2
        # running: 4 steps of 0.5 s; pending: the finished run's 20 s (3 s of steps, 17 s start-up); 2 jobs, so
        # (2 + 20) / 2, but no less than the longest point
        assert status.seconds_left(("running", "pending")) == pytest.approx(20, abs=0.5)
        status_command("st")
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert "6 points: 1 finished, 1 running, 2 stopped, 1 failed, 1 pending" in lines[0]
        assert lines[1].startswith("driver: running, 2 jobs · time left: about 20 s")
        assert "3 stopped or failed wait for the next launch" in lines[1]
        rows = {line.split()[0]: line for line in lines[3:]}
        assert lines[2].split() == ["state", "step", "point"]
        assert "its worker is gone; goes on from its step-3 checkpoint at the next launch" in out
        assert "starts again at the next launch" in out  # the KILLED one had no checkpoint
        assert "2/6" in rows["running"] and "-/6" in rows["pending"] and "RuntimeError: out of memory" in rows["failed"]
    finally:
        worker.kill()
        worker.wait()
        os.close(driver)
    status = gather("st")
    assert not status.driver and status.points[1].state == "stopped"  # its worker is gone now
    status_command("st")
    assert "driver: not running · the same command again finishes the rest" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"no study 'nope' at .* \(studies: st\)"):
        gather("nope")


def test_settle_waits_for_live_workers_and_marks_dead_runs_killed(study):
    store, points, _ = study
    alive = log_child(store.client, store, points[0], "RUNNING", steps=2)
    dead = log_child(store.client, store, points[1], "RUNNING", steps=2)
    done = log_child(store.client, store, points[2], "FINISHED", steps=6)
    worker = holder(point_folder(points[0], "st") / WORKER_LOCK, seconds=1.5)  # dies without ending its run
    said = []
    started = time.monotonic()
    store.settle(said.append)
    assert time.monotonic() - started >= 1.0, "it waited for the live worker"
    worker.wait()
    statuses = {r.info.run_id: r.info.status for r in store.children()}
    assert statuses == {alive: "KILLED", dead: "KILLED", done: "FINISHED"}
    assert "its worker died" in store.client.get_run(dead).data.tags["rlx.error"]
    assert said[0].startswith("waiting for an earlier launch's workers to stop (1; they hold the locks in")
    assert said[1].startswith("marked KILLED: 2")


def test_a_second_driver_on_a_running_study_is_one_line(workdir):
    home = workdir / "outputs" / "sweeps" / "busy"
    first = holder(home / DRIVER_LOCK)
    try:
        out = rlx("sweep", "trainer.steps=1", "--study", "busy", cwd=workdir)
    finally:
        first.kill()
        first.wait()
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert (
        "study 'busy' is being run by another rlx sweep/ablate" in out.stderr
        and "rlx status --study busy" in out.stderr
    )


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
