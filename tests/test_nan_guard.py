"""The NaN/inf guard: a non-finite update is skipped and counted; a persistent one fails the run, checkpoint intact."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHORT, mlflow_runs, rlx_together
from safetensors.torch import load_file

from rlx_cli.loops import checkpoint

# one torch thread: on a small shared machine more threads mostly wait for each other
RUN = [*SHORT, "rollout.group_size=4", "trainer.threads=1", "trainer.minibatches=2", "trainer.output_dir=out"]


def policy_weights(ckpt) -> dict[str, torch.Tensor]:
    return load_file(ckpt / "policy.safetensors")


def store(folder) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The two runs below at once (one thread each), each in a folder and MLflow store of its own: test name ->
    (its folder, its finished ``rlx train``)."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("injected", "persistent")}
    persistent = ["trainer.steps=8", "trainer.ckpt_every=2", "trainer.max_skipped=3"]
    injected, failed = rlx_together(
        ["train", *RUN, "trainer.ckpt_every=1", "trainer.keep_ckpts=3"],
        ["train", *RUN, *persistent],
        cwd=list(folders.values()),
        env=[{"MLFLOW_TRACKING_URI": store(folders["injected"]), "RLX_INJECT_NAN": "step:2"},
             {"MLFLOW_TRACKING_URI": store(folders["persistent"]), "RLX_INJECT_NAN": "from:3"}],
    )  # fmt: skip
    return {"injected": (folders["injected"], injected), "persistent": (folders["persistent"], failed)}


@pytest.mark.slow
def test_an_injected_nan_is_skipped_and_counted(runs, monkeypatch):
    workdir, out = runs["injected"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store(workdir))
    assert out.returncode == 0, out.stderr
    final = json.loads((workdir / "out" / "metrics.json").read_text())
    assert final["train/skipped_steps"] == 2 and final["train/skipped_consecutive"] == 0  # both minibatches of step 2

    from mlflow.tracking import MlflowClient

    run_id = mlflow_runs(workdir).iloc[0]["run_id"]
    skipped = {m.step: m.value for m in MlflowClient().get_metric_history(run_id, "train/skipped_steps")}
    assert skipped == {1: 0.0, 2: 2.0, 3: 2.0}
    step1, step2, step3 = (policy_weights(p) for p in checkpoint.complete(workdir / "out" / "checkpoints"))
    assert all(torch.equal(step1[k], step2[k]) for k in step1)  # the skipped step left the weights alone
    assert not all(torch.equal(step2[k], step3[k]) for k in step2)  # and training went on after it
    assert all(torch.isfinite(t).all() for t in step3.values())


@pytest.mark.slow
def test_a_persistent_nan_fails_the_run_and_keeps_the_last_good_checkpoint(runs, monkeypatch):
    workdir, out = runs["persistent"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store(workdir))
    assert out.returncode == 1, out.stderr
    error = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "Traceback" not in out.stderr
    assert "trainer.max_skipped=3" in error[0] and "out/checkpoints/step-000002" in error[0]

    run = mlflow_runs(workdir).iloc[0]
    assert run["status"] == "FAILED" and "non-finite" in run["tags.rlx.error"]
    kept = checkpoint.complete(workdir / "out" / "checkpoints")
    assert [p.name for p in kept] == ["step-000002"]  # steps 3 and 4 skipped every update: no checkpoint after
    assert json.loads((kept[0] / "state.json").read_text())  # complete, readable
    assert all(torch.isfinite(t).all() for t in policy_weights(kept[0]).values())
    assert not (workdir / "out" / "final").exists() and not (workdir / "out" / "metrics.json").exists()
