"""Resumable studies: liveness locks, a killed driver's workers, runs left RUNNING, ``rlx status`` (a study killed
mid-way and launched again: test_killed_study.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import rlx

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
