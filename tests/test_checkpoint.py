"""Checkpoints and resume: a run killed with SIGKILL and resumed ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import SHORT, mlflow_runs, rlx, rlx_start

from rlx_cli.loops import checkpoint

# one torch thread: on a small shared machine more threads mostly wait for each other
STEPS = [*(o for o in SHORT if not o.startswith("trainer.steps=")), "trainer.steps=8", "trainer.ckpt_every=2",
         "rollout.group_size=4", "trainer.threads=1"]  # fmt: skip


def metric_history(run_id: str) -> dict[str, dict[int, float]]:
    """metric -> step -> value, the last logged value per step (a resumed run re-logs the steps it redid)."""
    from mlflow.tracking import MlflowClient

    client, out = MlflowClient(), {}
    for key in client.get_run(run_id).data.metrics:
        if key.startswith("perf/"):
            continue
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
        out[key] = {m.step: m.value for m in history}
    return out


def without_perf(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


def test_pack_round_trips_nested_state_with_int_keys():
    tensors = {}
    state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}}, "groups": [{"betas": (0.9, 0.98)}]}
    back = checkpoint.unpack(json.loads(json.dumps(checkpoint.pack(state, "", tensors))), tensors)
    assert list(back["state"]) == [0] and torch.equal(back["state"][0]["exp_avg"], torch.ones(2))
    assert back["groups"][0]["betas"] == [0.9, 0.98]


# on-policy with each sampler (transformers' generate, rlx's own decode loop), and stale samples
RESUMED = {
    "on-policy-hf": ["rollout=hf"],
    "on-policy-fast": ["rollout=fast"],
    "lag-2": ["rollout.lag=2", "rollout_correction=tis"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RESUMED))
def test_sigkill_then_resume_equals_an_uninterrupted_run(workdir, case):
    extra, stale = RESUMED[case], case == "lag-2"
    uninterrupted = [*STEPS, *extra, "trainer.output_dir=straight", "tracking.experiment=straight"]
    straight = rlx_start("train", *uninterrupted, cwd=workdir, stdout=subprocess.DEVNULL)
    killed = [*STEPS, *extra, "trainer.output_dir=killed", "tracking.experiment=killed"]
    proc = rlx_start("train", *killed, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while checkpoint.latest(workdir / "killed") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (workdir / "killed" / "metrics.json").exists()
    killed_at = checkpoint.latest(workdir / "killed")
    assert killed_at is not None and killed_at.name != "step-000008"
    assert (killed_at / "behaviour.safetensors").is_file() == stale  # the versions the stale sampler keeps

    resumed = rlx("train", *killed, "trainer.resume=true", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {killed_at.relative_to(workdir)}" in resumed.stderr
    _, err = straight.communicate(timeout=600)  # the uninterrupted run, meanwhile on the other core
    assert straight.returncode == 0, err

    expected = json.loads((workdir / "straight" / "metrics.json").read_text())
    got = json.loads((workdir / "killed" / "metrics.json").read_text())
    assert without_perf(got) == without_perf(expected)
    assert "train/reward" in got and math.isfinite(got["eval/accuracy"])
    assert (got["train/rollout_kl"] > 1e-6) == stale  # samples two updates old differ from the trainer

    runs = mlflow_runs(workdir, "killed")
    assert len(runs) == 1 and runs.iloc[0]["status"] == "FINISHED"
    straight_run = mlflow_runs(workdir, "straight").iloc[0]
    assert metric_history(runs.iloc[0]["run_id"]) == metric_history(straight_run["run_id"])
    assert [p.name for p in checkpoint.complete(workdir / "killed" / "checkpoints")] == ["step-000006", "step-000008"]


def test_a_fresh_run_refuses_an_output_dir_with_checkpoints(workdir):
    (workdir / "out" / "checkpoints" / "step-000002").mkdir(parents=True)
    (workdir / "out" / "checkpoints" / "step-000002" / "state.json").write_text("{}")
    out = rlx("train", *SHORT, "trainer.output_dir=out", cwd=workdir)
    assert out.returncode == 2 and "trainer.resume=true" in out.stderr and "trainer.output_dir=out" in out.stderr


def test_a_signal_inside_the_loop_waits_for_the_step_outside_it_stops_at_once():
    import os

    from rlx_cli.loops.signals import Stopped, StopRequests

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs in the background
    with StopRequests() as stop:
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested == signal.SIGTERM
            assert stop.stop("checkpoint x").code == 143
        with pytest.raises(Stopped) as stopped:
            os.kill(os.getpid(), signal.SIGINT)
        assert stopped.value.code == 130
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def test_a_repeated_sigterm_is_one_request_a_second_ctrl_c_stops_at_once():
    """A dying sweep driver sends its worker SIGTERM once per thread of its own: the step must still finish."""
    import os

    from rlx_cli.loops.signals import Stopped, StopRequests

    with StopRequests() as stop:
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # the same request: no stop at once
            assert stop.requested == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # still a repeat while the run ends (KILLED), not a new stop
    with StopRequests() as stop:
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            with pytest.raises(Stopped):
                os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_ctrl_c_checkpoints_marks_killed_and_a_resume_finishes_the_same_run(workdir):
    run = [*STEPS, "trainer.ckpt_every=0", "trainer.output_dir=out"]
    proc = subprocess.Popen([sys.executable, "-m", "rlx_cli", "train", *run], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    for line in proc.stderr:
        if line.startswith("RL ..."):  # the loop has started
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait() == 130, rest
    assert "stopped by SIGINT" in rest and "out/checkpoints/step-" in rest and "Traceback" not in rest
    assert mlflow_runs(workdir).iloc[0]["status"] == "KILLED"
    stopped_at = checkpoint.latest(workdir / "out")
    assert stopped_at is not None and not (workdir / "out" / "final").exists()

    resumed = rlx("train", *run, "trainer.resume=true", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    runs = mlflow_runs(workdir)
    assert len(runs) == 1 and runs.iloc[0]["status"] == "FINISHED"


@pytest.fixture
def flaky_task(workdir, monkeypatch):
    """A tiny random Llama, sums prompts in a JSONL file and a verifier that raises on every odd-length response."""
    from conftest import save_tiny_llama

    model = save_tiny_llama(workdir / "model", layers=1, heads=1, head_dim=32, tie=True)
    rows = [{"prompt": f"{a},{b}:", "answer": str(a + b)} for a in range(1, 10) for b in range(1, 10)]
    (workdir / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (workdir / "flaky_verifiers.py").write_text(
        "def flaky(response, answer):\n"
        "    if len(response) % 2:\n        raise ValueError('odd')\n"
        "    return float(response.rpartition('#')[2] == answer)\n"
    )
    monkeypatch.syspath_prepend(str(workdir))
    yield [
        *("model=hf", f"model.path={model}", "task=jsonl", f"task.path={workdir / 'sums.jsonl'}"),
        *("task.verifier=flaky_verifiers:flaky", "rollout.max_new_tokens=8", "rollout.prompts_per_step=4"),
        *("trainer.steps=4", "trainer.ckpt_every=2", "trainer.keep_ckpts=3", "trainer.eval_every=0"),
        "trainer.threads=1",
    ]
    sys.modules.pop("flaky_verifiers", None)


@pytest.mark.slow
def test_a_resume_carries_reward_errors_and_stores_each_step_once(workdir, flaky_task):
    """The verifier-error counter goes on from the checkpoint, and steps redone after it are not stored twice."""
    import shutil

    from mlflow.tracking import MlflowClient

    from rlx_cli.loops.run import train_command

    straight = train_command([*flaky_task, "trainer.output_dir=straight", "tracking.experiment=straight"])
    again = [*flaky_task, "trainer.output_dir=again", "tracking.experiment=again"]
    train_command(again)
    shutil.rmtree(workdir / "again" / "checkpoints" / "step-000004")  # as if it died after storing steps 3 and 4
    resumed = train_command([*again, "trainer.resume=true"])
    assert straight["train/reward_errors"] > 0
    assert resumed["train/reward_errors"] == straight["train/reward_errors"]  # not restarted at 0 by the resume
    assert without_perf(resumed) == without_perf(straight)

    client, run_id = MlflowClient(), mlflow_runs(workdir, "again").iloc[0]["run_id"]
    for key in ("train/reward_errors", "train/reward", "train/loss"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3, 4]  # each step once
    assert metric_history(run_id) == metric_history(mlflow_runs(workdir, "straight").iloc[0]["run_id"])
