"""``rollout.overlap``: a run whose next step samples in a process of its own during the update is the run without
it (every logged metric, the final weights); it resumes after SIGKILL where an uninterrupted run ends; a dead sampler
fails the run instead of hanging it. ``trainer.old_logp=sampler``: the sampler's log-probs are PPO's old ones."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import SHORT, mlflow_runs, rlx, rlx_start
from safetensors.torch import load_file
from test_checkpoint import metric_history

from rlx_cli.loops import checkpoint

RUN = [*(o for o in SHORT if not o.startswith("trainer.steps=")), "trainer.steps=4", "trainer.eval_every=2",
       "rollout.group_size=4", "trainer.ckpt_every=0", "rollout.threads=1"]  # fmt: skip
TOLERANCE = 1e-6

# samplers (fast: the default) x fine-tuning x lag, each with another ingredient the sampler process must carry over
EQUAL = {
    "fast-full-lag1-dapo-carried": ["rollout.lag=1", "algo=dapo", "rollout.carry_surplus=true", "seed=1"],
    "fast-lora-lag2-tis": ["rollout=fast", "model.finetune=lora", "rollout.lag=2", "rollout_correction=tis"],
    "hf-full-lag2-sampler-logp": ["rollout=hf", "rollout.lag=2", "trainer.old_logp=sampler"],
    "hf-lora-lag1": ["rollout=hf", "model.finetune=lora", "rollout.lag=1"],
    "fast-full-lag1-bf16-checkpointing": ["rollout.lag=1", "rollout.dtype=bf16", "model.activation_checkpointing=true"],
}


def final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted((output_dir / "final").glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EQUAL))
def test_overlap_gives_the_same_run(workdir, case):
    for overlap in ("false", "true"):
        out = rlx("train", *RUN, *EQUAL[case], f"rollout.overlap={overlap}", f"trainer.output_dir=out-{overlap}",
                  cwd=workdir)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    runs = mlflow_runs(workdir).set_index("params.rollout.overlap")
    histories = [metric_history(runs.loc[flag, "run_id"]) for flag in ("False", "True")]
    assert histories[0].keys() == histories[1].keys() and "train/loss" in histories[0]
    for key, by_step in histories[0].items():
        assert by_step.keys() == histories[1][key].keys(), key
        for step, value in by_step.items():
            assert abs(value - histories[1][key][step]) <= TOLERANCE, (key, step, value, histories[1][key][step])
    if "rollout.carry_surplus=true" in EQUAL[case]:
        assert max(histories[0]["train/groups_kept"].values()) > max(histories[0]["train/groups"].values())
    weights = [final_weights(workdir / f"out-{flag}") for flag in ("false", "true")]
    assert weights[0].keys() == weights[1].keys() and weights[0]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


STALE = [*(o for o in RUN if not o.startswith(("trainer.steps=", "trainer.ckpt_every="))), "trainer.steps=8",
         "trainer.ckpt_every=2", "rollout.lag=1"]  # fmt: skip


@pytest.mark.slow
def test_sigkill_then_resume_with_overlap_ends_where_the_sequential_run_ends(workdir):
    straight = rlx("train", *STALE, "trainer.output_dir=straight", "tracking.experiment=straight", cwd=workdir)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = [*STALE, "rollout.overlap=true", "trainer.output_dir=killed", "tracking.experiment=killed"]
    proc = rlx_start("train", *killed, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while checkpoint.latest(workdir / "killed") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler = sampler_process(proc.pid)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = checkpoint.latest(workdir / "killed")
    assert killed_at is not None and killed_at.name != "step-000008"
    assert sampler is not None and gone(sampler, 30), "the sampler process outlived its trainer"

    resumed = rlx("train", *killed, "trainer.resume=true", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = json.loads((workdir / "straight" / "metrics.json").read_text())
    got = json.loads((workdir / "killed" / "metrics.json").read_text())
    assert {k for k in got if not k.startswith("perf/")} == {k for k in expected if not k.startswith("perf/")}
    assert all(abs(got[k] - expected[k]) <= TOLERANCE for k in expected if not k.startswith("perf/"))
    runs = mlflow_runs(workdir, "killed")
    assert len(runs) == 1 and runs.iloc[0]["status"] == "FINISHED"
    straight_history = metric_history(mlflow_runs(workdir, "straight").iloc[0]["run_id"])
    assert metric_history(runs.iloc[0]["run_id"]).keys() == straight_history.keys()


@pytest.mark.slow
def test_a_dead_sampler_fails_the_run_instead_of_hanging_it(workdir):
    args = [*STALE, "rollout.overlap=true", "trainer.steps=500", "trainer.eval_every=0", "trainer.ckpt_every=0"]
    proc = rlx_start("train", *args, "trainer.output_dir=out", cwd=workdir, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (sampler := sampler_process(proc.pid)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sampler, "no sampler process started"
    while not mlflow_runs(workdir).shape[0] and time.monotonic() < deadline:  # the run is tracked: the loop began
        time.sleep(0.2)
    time.sleep(3.0)  # a few steps in
    os.kill(sampler, signal.SIGKILL)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the trainer still waits for a dead sampler")
    assert proc.returncode not in (0, -signal.SIGKILL) and "the sampler process (rollout.overlap) died" in stderr
    runs = mlflow_runs(workdir)
    assert len(runs) == 1 and runs.iloc[0]["status"] == "FAILED"


def sampler_process(parent: int) -> int | None:
    """The pid of ``parent``'s spawned sampler process (not multiprocessing's resource tracker), None if none."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and b"spawn_main" in cmdline:
            return int(stat.parent.name)
    return None


def gone(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_old_logp_sampler_takes_the_sampler_log_probs_and_skips_the_recompute(workdir, monkeypatch):
    from rlx_cli.engine.engine import Engine
    from rlx_cli.loops import loop
    from rlx_cli.loops.run import train_command

    forwards, seen = [], []
    logp, update_step = Engine.logp, loop.update_step

    def counted(self, batch, temperature, *, reference=False):
        forwards.append(reference)
        return logp(self, batch, temperature, reference=reference)

    def recorded(cfg, parts, state, step, inputs):
        seen.append(torch.equal(inputs.old_logp, inputs.batch.sampler_logp))
        return update_step(cfg, parts, state, step, inputs)

    monkeypatch.setattr(Engine, "logp", counted)
    monkeypatch.setattr(loop, "update_step", recorded)
    args = [*SHORT, "trainer.steps=2", "rollout.group_size=4", "trainer.minibatches=2", "kl=none", "tracking=none"]
    final = train_command([*args, "rollout.lag=1", "trainer.old_logp=sampler"])
    assert seen == [True, True] and forwards.count(False) == 0
    assert "train/rollout_kl" not in final  # no trainer log-probs of the old policy to compare with
    train_command([*args, "rollout.lag=1", "trainer.old_logp=trainer", "trainer.output_dir=recomputed"])
    assert forwards.count(False) == 2  # one recompute a step


def test_old_logp_sampler_without_the_samplers_log_probs_fails_instead_of_using_the_updates(workdir, monkeypatch):
    from rlx_cli.engine import distributed
    from rlx_cli.loops.run import train_command

    gather = distributed.gather_samples

    def without_logp(*args):  # a sampler that returned no log-probs of its tokens
        batch, scores, group_index, metrics, own = gather(*args)
        return batch, scores, group_index, metrics, dataclasses.replace(own, sampler_logp=None)

    monkeypatch.setattr(distributed, "gather_samples", without_logp)
    args = [*SHORT, "trainer.steps=1", "rollout.group_size=4", "tracking=none", "rollout.lag=1"]
    with pytest.raises(RuntimeError, match="trainer.old_logp=sampler, but the sampler returned no log-probs"):
        train_command([*args, "trainer.old_logp=sampler"])
