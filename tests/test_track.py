"""MLflow tracking: metrics are logged off the training loop and all of them are in the store once the run ends."""

from __future__ import annotations

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
        "raise SystemExit(143)  # as a second signal that cut the run's end short\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 143, out.stderr
    run_id = out.stdout.split()[-1]
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "KILLED"
