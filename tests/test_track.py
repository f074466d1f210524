"""MLflow tracking: metrics are logged off the training loop and all of them are in the store once the run ends."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlx_cli.loops.track import MlflowTracker


def test_queued_metrics_are_all_stored_when_the_run_ends(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = MlflowTracker("queued", "run")
    tracker.connect()
    tracker.start(OmegaConf.create({"seed": 0}), {"rlx.algo": "grpo"})
    client = MlflowClient()
    for step in range(1, 51):
        tracker.log_metrics({"train/reward": step / 100, "perf/step_s": 0.1}, step=step)
        if step == 30:  # as before a checkpoint: everything so far is stored once flush returns
            tracker.flush()
            assert len(client.get_metric_history(tracker.run_id, "train/reward")) == 30
    tracker.end("FINISHED")

    history = client.get_metric_history(tracker.run_id, "train/reward")
    assert sorted((m.step, m.value) for m in history) == [(s, s / 100) for s in range(1, 51)]
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


def test_a_flush_never_waits_for_mlflows_once_a_second_logging_thread(tmp_path, monkeypatch):
    """MLflow's ``synchronous=False`` queue is looked at once a second and its flush restarts its thread: each
    checkpoint and each run's end waited up to a second for nothing. rlx's writer is waited for batch by batch."""
    from mlflow.utils.async_logging import async_logging_queue

    def refuse(*args, **kwargs):
        raise AssertionError("MLflow's asynchronous logging queue was used")

    monkeypatch.setattr(async_logging_queue.AsyncLoggingQueue, "activate", refuse)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = MlflowTracker("writer", "run")
    tracker.connect()
    tracker.start(OmegaConf.create({"seed": 0}), {})
    tracker.log_metrics({"train/reward": 0.5}, step=1)
    tracker.flush()
    tracker.log_metrics({"train/reward": 0.25}, step=2)
    tracker.end("FINISHED")
    assert tracker.writer is None  # its thread is gone with the run


def test_a_write_that_failed_is_raised_by_the_next_flush(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = MlflowTracker("failing", "run")
    tracker.connect()
    tracker.start(OmegaConf.create({"seed": 0}), {})
    started, tracker.run_id = tracker.run_id, "0" * 32  # a run the store does not have
    tracker.log_metrics({"train/reward": 0.5}, step=1)
    tracker.hand_over()
    with pytest.raises(mlflow.exceptions.MlflowException):
        tracker.flush()
    tracker.run_id = started
    tracker.end("FINISHED")


def test_a_run_left_open_at_exit_ends_killed_not_finished(tmp_path):
    """MLflow's exit hook would end an open run FINISHED, and a study would skip it as done."""
    import os
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = (
        "from omegaconf import OmegaConf\nfrom rlx_cli.loops.track import MlflowTracker\n"
        "tracker = MlflowTracker('open', 'run')\ntracker.connect()\n"
        "tracker.start(OmegaConf.create({'seed': 0}), {})\nprint(tracker.run_id)\n"
        "for step in range(1, 4):\n    tracker.log_metrics({'train/reward': step / 10}, step)\n"
        "tracker.hand_over()\ntracker.log_metrics({'train/reward': 0.4}, 4)  # kept, not handed over\n"
        "raise SystemExit(143)  # as a second signal that cut the run's end short\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 143, out.stderr
    run_id = out.stdout.split()[-1]
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "KILLED"
    history = client.get_metric_history(run_id, "train/reward")  # the steps it did, handed over or not
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
