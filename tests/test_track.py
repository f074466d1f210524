"""MLflow tracking: metrics are logged off the training loop and all of them are in the store once the run ends."""

from __future__ import annotations

from omegaconf import OmegaConf

from rlx_cli.track import MlflowTracker


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
