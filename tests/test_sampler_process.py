"""The sampler process of ``rollout.overlap`` as a process: how many threads it and the trainer take, how long the
trainer waits for it, the weights it reads on a GPU, its own errors, the trainer's judge, and signals (SIGTERM to the
trainer, Ctrl-C to the process group while the sampler starts, the trainer's death): each ends the run as it should."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, SHORT, mlflow_runs, rlx_start, save_tiny_llama
from omegaconf import OmegaConf
from test_overlap import STALE, gone, sampler_process

from rlx_cli.loops import checkpoint


@pytest.mark.parametrize(
    ("trainer", "sampler", "overlap", "cores", "expected"),
    [
        (0, 0, False, 2, (0, 0)),  # no sampler process: torch's default
        (0, 0, True, 2, (1, 1)),  # the 2 cores split: never 4 threads on 2 cores
        (0, 0, True, 3, (2, 1)),
        (0, 0, True, 16, (8, 8)),
        (0, 0, True, 1, (1, 1)),  # at least one each
        (3, 0, True, 4, (3, 1)),  # what trainer.threads leaves
        (0, 3, True, 4, (1, 3)),  # what rollout.threads leaves
        (4, 4, True, 2, (4, 4)),  # both set: as set
    ],
)
def test_the_trainer_and_the_sampler_process_split_the_cores(trainer, sampler, overlap, cores, expected):
    from rlx_cli.loops.build import thread_counts

    cfg = OmegaConf.create({"trainer": {"threads": trainer}, "rollout": {"threads": sampler, "overlap": overlap}})
    assert thread_counts(cfg, cores) == expected


class Alive:
    """A process that never answers and never dies."""

    exitcode = None

    def is_alive(self) -> bool:
        return True

    def join(self, timeout=None) -> None:
        pass


def test_a_live_but_silent_sampler_fails_the_wait_at_its_bound():
    from rlx_cli.loops.overlap import SamplerFailed, answer

    results: queue.Queue = queue.Queue()
    results.put(("batch", "ready"))
    assert answer(results, Alive(), 1, 1.0) == ("batch", "ready")
    outcome = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            answer(results, Alive(), 7, 1.5)
        except SamplerFailed as error:
            outcome["error"], outcome["waited"] = str(error), time.monotonic() - started

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    waiting.join(timeout=60)  # far past the bound: without one the wait goes on for ever
    assert not waiting.is_alive(), "the trainer waits for ever for a silent sampler"
    assert outcome["waited"] >= 1.5  # not before the bound
    assert "at step 7" in outcome["error"] and "rollout.overlap_timeout=1.5" in outcome["error"]


def test_loading_the_sampling_copy_waits_for_the_gpu(monkeypatch):
    """On CUDA ``copy_`` only queues the copies: ``load`` returns once they are done, so the sampler process (which
    reads the copy through CUDA IPC) never sees half-written weights. Here a CPU copy with the GPU's calls stubbed."""
    from rlx_cli.engine import behaviour

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    on_gpu = SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device("cuda", 1))]))
    behaviour.settle(on_gpu)
    assert synced == [torch.device("cuda", 1)]
    behaviour.settle(torch.nn.Linear(2, 2))  # the CPU: copy_ is done when it returns
    assert synced == [torch.device("cuda", 1)]

    policy = torch.nn.Linear(2, 2)
    copy = behaviour.Behaviour(policy, lag=1, dtype="fp32")
    settled = []
    monkeypatch.setattr(behaviour, "settle", lambda model: settled.append(model.weight.detach().clone()))
    with torch.no_grad():
        policy.weight.fill_(3.0)
    copy.keep(policy)
    copy.keep(policy)
    assert copy.load(ahead=1) is copy.model
    assert len(settled) == 1 and torch.equal(settled[0], torch.full((2, 2), 3.0))  # settled after the last copy


@pytest.mark.slow
def test_a_sampler_that_fails_to_set_up_fails_the_run_with_its_traceback(workdir, monkeypatch):
    from rlx_cli.loops.overlap import SamplerFailed
    from rlx_cli.loops.run import train_command

    model = save_tiny_llama(workdir / "model", layers=1, heads=2, head_dim=16)
    (workdir / "sampler_side.py").write_text(
        "import multiprocessing\n"
        "if multiprocessing.current_process().name == 'rlx-sampler':\n"
        "    raise RuntimeError('this verifier does not load in the sampler process')\n"
        "def verify(response, answer):\n    return float(response.strip() == answer)\n"
    )
    monkeypatch.syspath_prepend(str(workdir))  # the sampler process gets this path too
    task = ["model=hf", f"model.path={model}", "task=jsonl", f"task.path={REPO / 'examples' / 'arithmetic.jsonl'}"]
    run = [o for o in SHORT if not o.startswith("task.eval_size=")]  # a file's held-out rows are its own
    args = [*run, *task, "task.verifier=sampler_side:verify", "rollout.lag=1", "rollout.overlap=true"]
    with pytest.raises(SamplerFailed) as failed:
        train_command([*args, "rollout.group_size=2", "trainer.output_dir=out"])
    sys.modules.pop("sampler_side", None)
    message = str(failed.value)
    assert "the sampler process (rollout.overlap) failed at step 1" in message
    assert "Traceback" in message and "does not load in the sampler process" in message
    runs = mlflow_runs(workdir)
    assert len(runs) == 1 and runs.iloc[0]["status"] == "FAILED"


@pytest.mark.slow
def test_the_sampler_process_scores_with_the_trainers_judge(workdir, monkeypatch):
    """``task.verifier=judge``: the trainer loads the judge once and hands it to the sampler process; its folder is
    gone by the time the sampler sets up, so a second load there would fail the run. The step's time splits into the
    trainer's stages, its wait for the batch among them; the sampler's own sampling time is a metric of its own."""
    from rlx_cli.loops.run import train_command
    from rlx_cli.sampling.judge import Judge

    judge_dir = save_tiny_llama(workdir / "judge", layers=1, heads=2, head_dim=16)
    load, loaded = Judge.load.__func__, []

    def load_then_remove(cls, cfg, device, dtype):
        judge = load(cls, cfg, device, dtype)
        loaded.append(cfg.path)
        shutil.rmtree(cfg.path)
        return judge

    monkeypatch.setattr(Judge, "load", classmethod(load_then_remove))
    judge = [
        "task.verifier=judge",
        f"task.judge.path={judge_dir}",
        "task.judge.yes=1",
        "task.judge.no=0",
        "task.judge.template='{question}{response}={reference}:'",
    ]
    run = [*SHORT, *judge, "rollout.group_size=2", "rollout.lag=1", "rollout.overlap=true", "tracking=none"]
    final = train_command([*run, "trainer.output_dir=out"])
    assert loaded == [str(judge_dir)]
    assert 0 < final["train/reward"] < 1 and final["train/reward_errors"] == 0  # soft rewards: the judge scored
    stages = [final[f"perf/{stage}_s"] for stage in ("sample_wait", "logprobs", "update", "sync")]  # the trainer's
    assert sum(stages) == pytest.approx(final["perf/step_s"], rel=1e-6) and final["perf/generate_s"] > 0


def start(workdir, args: list[str]):
    """``rlx train ARGS`` in a session of its own (a terminal's Ctrl-C reaches its whole process group)."""
    return rlx_start("train", *args, cwd=workdir, stdout=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["sigterm-to-the-trainer", "ctrl-c-while-the-sampler-starts"])
def test_a_signal_with_overlap_checkpoints_and_ends_the_run_killed(workdir, when):
    """SIGTERM to the trainer mid-run, or Ctrl-C to the whole process group while the sampler process is still
    importing: the trainer ends its step and checkpoints, the run ends KILLED, the sampler process goes with it."""
    args = [*STALE, "rollout.overlap=true", "trainer.steps=200", "trainer.eval_every=0", "trainer.output_dir=out"]
    proc = start(workdir, args)
    deadline = time.monotonic() + 300
    while not (sampler := sampler_process(proc.pid)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler, "no sampler process started"
    if when == "sigterm-to-the-trainer":
        while not mlflow_runs(workdir).shape[0] and time.monotonic() < deadline:  # the run is tracked
            time.sleep(0.2)
        time.sleep(2.0)  # a few steps in
        proc.send_signal(signal.SIGTERM)
        signum = signal.SIGTERM
    else:
        os.killpg(proc.pid, signal.SIGINT)  # the sampler process imports torch for seconds after it appears
        signum = signal.SIGINT
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert f"stopped by {signal.Signals(signum).name}: checkpoint" in stderr
    assert checkpoint.latest(workdir / "out") is not None
    runs = mlflow_runs(workdir)
    assert len(runs) == 1 and runs.iloc[0]["status"] == "KILLED"
    assert gone(sampler, 30), "the sampler process outlived its trainer"


@pytest.mark.slow
def test_the_kernel_ends_an_orphaned_sampler_at_once(workdir):
    """The trainer killed while its sampler process cannot run (stopped here, as if busy with a long batch): the
    kernel kills the sampler with it (PR_SET_PDEATHSIG) instead of leaving it to notice after its batch."""
    args = [*STALE, "rollout.overlap=true", "trainer.steps=500", "trainer.eval_every=0", "trainer.output_dir=out"]
    proc = start(workdir, args)
    deadline = time.monotonic() + 300
    while checkpoint.latest(workdir / "out") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # step 2 is done: the sampler process has served steps 1 to 3
    sampler = sampler_process(proc.pid)
    assert sampler, "no sampler process"
    os.kill(sampler, signal.SIGSTOP)
    try:
        proc.kill()
        proc.wait(timeout=60)
        assert gone(sampler, 30), "the orphaned sampler process lives on"
    finally:
        if not gone(sampler, 0):
            os.kill(sampler, signal.SIGKILL)
