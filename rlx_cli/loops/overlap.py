"""``rollout.overlap``: the next step's batch sampled in a process of its own while this step's update runs.

With ``rollout.lag`` >= 1 step s + 1 samples with the policy after step s − lag, which exists before step s updates.
So at step s, once its batch is in, the trainer loads that version into the sampling copy (``engine/behaviour.py``),
whose tensors are in shared memory (``share_memory_()``), asks the sampler process for step s + 1 and updates while
it samples. The sampler draws what the sequential loop would: the same prompts (a function of the seed, the step and
the draw), the same random stream (``distributed.sampling_stream``), the same weights, and DAPO's carried groups with
each request; the batch comes back through shared memory (torch.multiprocessing's queues). So a run with overlap is
the run without it, metric for metric, when the sampler computes with as many threads as the sequential run sampled
with (other counts may sum floats in another order). By default the two processes split the cores between them
(``build.thread_counts``): two busy processes that each took every core would fight over them.

The sampler process ignores Ctrl-C and SIGTERM from its start (the trainer ends its step, checkpoints and stops it),
ends when the trainer asks, and is killed by the kernel the moment the trainer dies (Linux; elsewhere after its batch).
An error in it, its death, or a silence of ``rollout.overlap_timeout`` seconds fails the run (FAILED, with the error).
Its metrics: ``perf/generate_s`` is its own sampling time; the loop logs the trainer's wait as ``perf/sample_wait_s``.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf
from torch import nn

from rlx_cli.engine.allocator import map_large_allocations
from rlx_cli.engine.engine import Engine
from rlx_cli.engine.models import Models
from rlx_cli.loops.build import Parts, build_task, components_of, thread_counts
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.groups import Groups, sample_groups
from rlx_cli.sampling.judge import Judge, JudgedTask

LIVENESS_S = 1.0  # how often a waiting side checks that the other is still alive
ERRORS = "train/reward_errors"
STOPS = {signal.SIGINT, signal.SIGTERM}  # the trainer's to handle: it stops the sampler process itself
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class SamplerFailed(RuntimeError):
    """The sampler process raised or died: the run fails with this."""


@dataclass
class Setup:
    """What the sampler process is started with: the resolved config, the sampling copy (shared memory), the sampler
    (with its tokenizer), the autocast dtype, the trainer's judge (``task.verifier=judge``; None without) and the
    trainer's process id."""

    config: dict
    model: nn.Module
    sampler: object
    compute_dtype: torch.dtype | None
    judge: Judge | None
    trainer: int


class SamplerProcess:
    """The sampler process and the step it is sampling; ``take`` is the loop's steps 1–2. A context manager, entered
    where the process starts: leaving it stops the process, whatever ended the run."""

    def __init__(self, cfg: DictConfig, parts: Parts):
        self.cfg, self.parts, self.behaviour = cfg, parts, parts.behaviour
        self.behaviour.model.share_memory()  # the trainer writes each version in, the sampler reads it
        judge = parts.task.judge if isinstance(parts.task, JudgedTask) else None
        if judge is not None:
            judge.model.share_memory()  # one judge model for both processes, built once (loops/build.py)
        context = mp.get_context("spawn")  # a fresh interpreter: no copy of the trainer's threads or locks
        self.requests, self.results = context.Queue(), context.Queue()
        config = OmegaConf.to_container(cfg, resolve=True)
        setup = Setup(config, self.behaviour.model, parts.sampler, parts.models.compute_dtype, judge, os.getpid())
        self.process = context.Process(
            target=serve, args=(setup, self.requests, self.results), name="rlx-sampler", daemon=True
        )  # a daemon: ended at the trainer's exit too
        with held(STOPS):  # a Ctrl-C to the process group while it imports waits for serve, which ignores it
            self.process.start()
        self.pending: int | None = None

    def take(self, step: int, policy: nn.Module, state: TrainState):
        """Step ``step``'s (batch, scores [B], group_index [B], metrics), as ``sample_groups`` gives them; the
        sampler then starts on the next step. ``state.carried`` becomes what the step carries on."""
        self.behaviour.keep(policy)
        if self.pending != step:  # the first step of a run or a resumed run
            self.behaviour.load()
            self.submit(step, state.carried)
        sampled, state.carried = self.wait(step)
        task = self.parts.task  # the sampler counts this step's verifier errors, the trainer the run's
        task.reward_errors += int(sampled[3][ERRORS])
        sampled[3][ERRORS] = float(task.reward_errors)
        if step < self.cfg.trainer.steps:
            self.behaviour.load(ahead=1)  # the sampler is idle: its weights can change
            self.submit(step + 1, state.carried)
        return sampled

    def submit(self, step: int, carried: Groups) -> None:
        carried = carried if self.cfg.rollout.carry_surplus else None
        self.requests.put((step, carried))
        self.pending = step

    def wait(self, step: int):
        """The answer to the request for ``step``: (the sampled tuple, the carried groups)."""
        kind, payload = answer(self.results, self.process, step, self.cfg.rollout.overlap_timeout)
        if kind == "error":
            raise SamplerFailed(f"the sampler process (rollout.overlap) failed at step {step}:\n{payload}")
        self.pending = None
        sampled, carried = payload
        return sampled, carried if carried is not None else Groups()

    def close(self) -> None:
        """Stop the sampler process: at once if it is sampling a step nobody will take."""
        if self.process.is_alive() and self.pending is None:
            self.requests.put(None)
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

    def __enter__(self) -> SamplerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def answer(results, process, step: int, timeout: float):
    """The sampler ``process``'s next message on ``results``, (kind, payload), waiting at most ``timeout`` seconds
    -> SamplerFailed when it dies first or stays silent that long while alive."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return results.get(timeout=max(0.0, min(LIVENESS_S, deadline - time.monotonic())))
        except queue.Empty:
            cut = None
        except (EOFError, OSError, RuntimeError, pickle.UnpicklingError) as error:  # a batch cut off mid-way
            cut = error
            process.join(timeout=5.0)  # by the sampler's death: its pipe or shared memory gone
        if not process.is_alive():
            code = process.exitcode
            raise SamplerFailed(f"the sampler process (rollout.overlap) died at step {step}, exit code {code}")
        if cut is not None:
            raise cut
        if time.monotonic() >= deadline:
            raise SamplerFailed(
                f"the sampler process (rollout.overlap) sent nothing for {timeout:g} s at step {step}, alive but "
                f"silent (rollout.overlap_timeout={timeout:g}; set it higher where a step samples for longer)"
            )


@contextmanager
def held(signals: set[signal.Signals]) -> Iterator[None]:
    """``signals`` held back in this thread, and in a process it starts meanwhile, which inherits the mask until it
    unblocks them (as multiprocessing's resource tracker is started); here they are delivered on the way out."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def end_with(trainer: int) -> None:
    """Have the kernel kill this process when the ``trainer`` that started it ends (Linux's ``PR_SET_PDEATHSIG``):
    an orphaned sampler stops at once, not after its batch. Elsewhere the liveness checks of ``serve`` end it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != trainer:  # the trainer died before the request: no signal will come
        os._exit(0)


def serve(setup: Setup, requests, results) -> None:
    """The sampler process: answer each request (step, carried groups) with that step's sampled groups until the
    trainer sends None or is gone. Any failure, its set-up's included, goes back as ("error", its traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer stops after its step and then ends this process
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # held since the trainer started it (``held``): now ignored
    end_with(setup.trainer)
    try:
        map_large_allocations()  # as the trainer (loops/run.py): sampling's [rows, vocabulary] tensors leave no heap
        cfg = OmegaConf.create(setup.config)
        threads = thread_counts(cfg)[1]
        if threads:
            torch.set_num_threads(threads)
        parts = sampler_parts(cfg, setup)
    except Exception:  # noqa: BLE001 - any failure here fails the run, with its traceback
        results.put(("error", traceback.format_exc()))
        return
    parent = mp.parent_process()
    while True:
        try:
            request = requests.get(timeout=LIVENESS_S)
        except queue.Empty:
            if parent is None or not parent.is_alive():
                results.cancel_join_thread()  # nobody reads: exit without flushing
                return
            continue
        if request is None:
            return
        step, carried = request
        started = time.perf_counter()
        try:
            parts.task.reward_errors = 0  # this step's count: the trainer keeps the run's
            sampled = sample_groups(cfg, parts, step, parts.models.policy, carried)
        except Exception:  # noqa: BLE001 - any failure here fails the run, with its traceback
            results.put(("error", traceback.format_exc()))
            return
        sampled[3]["perf/generate_s"] = time.perf_counter() - started  # its sampling, beside the trainer's update
        results.put(("batch", (sampled, carried)))


def sampler_parts(cfg: DictConfig, setup: Setup) -> Parts:
    """The sampler process's Parts: the sampling copy as its policy, the task (scored by the trainer's judge, if any),
    the sampler; nothing that trains."""
    model = setup.model
    task = build_task(cfg.task)
    if setup.judge is not None:
        task = JudgedTask(task, setup.judge)
    tokenizer = setup.sampler.tokenizer
    models = Models(model, tokenizer, None, None, None, None, setup.compute_dtype)
    engine = Engine(models, micro_batch_tokens=cfg.trainer.micro_batch_tokens, strategy="ddp")
    return Parts(models, task, setup.sampler, components_of(cfg), None, None, None, engine)
