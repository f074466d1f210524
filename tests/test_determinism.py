"""Two runs with the same seed on the CPU log the same metrics and end with the same weights."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHORT, mlflow_runs, rlx_together
from safetensors.torch import load_file

# one torch thread: on a small shared machine more threads mostly wait for each other
RUN = [*SHORT, "rollout.group_size=4", "trainer.threads=1", "trainer.ckpt_every=0"]


def history(run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("perf/")]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


@pytest.mark.slow
@pytest.mark.parametrize("rollout", ["hf", "fast"])  # transformers' generate, rlx's own decode loop
def test_same_seed_same_metrics(workdir, rollout):
    commands = [["train", *RUN, f"rollout={rollout}", "seed=3", f"trainer.output_dir={name}"] for name in "ab"]
    for out in rlx_together(*commands, cwd=workdir):
        assert out.returncode == 0, out.stderr
    metrics = [json.loads((workdir / name / "metrics.json").read_text()) for name in ("a", "b")]
    a, b = ({k: v for k, v in m.items() if not k.startswith("perf/")} for m in metrics)
    assert a == b and "train/loss" in a

    runs = mlflow_runs(workdir)
    assert len(runs) == 2
    assert history(runs.iloc[0]["run_id"]) == history(runs.iloc[1]["run_id"])
    weights = [load_file(workdir / name / "final" / "model.safetensors") for name in ("a", "b")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.slow
def test_arms_with_one_seed_draw_the_same_step_0_evaluation(workdir):
    """GRPO and VAPO (a critic built and pretrained first: random numbers drawn before step 0) from the same base and
    seed: their step-0 sampled evaluations are the same answers, so a study's arms start from one shared figure."""
    args = [*RUN, "trainer.steps=1", "eval.samples=4", "tracking.experiment=crn"]
    commands = [["train", *args, "algo=grpo", "trainer.output_dir=grpo"],
                ["train", *args, "algo=vapo", "value_pretrain.steps=2", "trainer.output_dir=vapo"]]  # fmt: skip
    for out in rlx_together(*commands, cwd=workdir):
        assert out.returncode == 0, out.stderr[-2000:]
    from mlflow.tracking import MlflowClient

    runs = mlflow_runs(workdir, "crn")  # first: it points MLflow at this test's store
    client = MlflowClient()
    first = {
        key: [client.get_metric_history(r, key)[0] for r in runs["run_id"]]
        for key in ("eval/accuracy_sampled", "eval/accuracy", "eval/response_len")
    }
    for key, (a, b) in first.items():
        assert a.step == b.step == 0 and a.value == b.value, key
    assert 0 < first["eval/accuracy_sampled"][0].value < 1  # a draw that other random numbers would change
