"""``rollout.overlap``: the next step's batch sampled in a process of its own while this step's update runs.

With ``rollout.lag`` >= 1 step s + 1 samples with the policy after step s − lag, which exists before step s updates.
So at step s, once its batch is in, the trainer loads that version into the sampling copy (``engine/behaviour.py``),
whose tensors are in shared memory (``share_memory_()``), asks the sampler process for step s + 1 and updates while
it samples. The sampler draws what the sequential loop would: the same prompts (a function of the seed, the step and
the draw), the same random stream (``distributed.sampling_stream``), the same weights, and DAPO's carried groups with
each request; the batch comes back through shared memory (torch.multiprocessing's queues). So a run with overlap is
the run without it, metric for metric, when the sampler computes with as many threads as the trainer
(``rollout.threads``; other counts sum floats in another order).

The sampler process ignores Ctrl-C and SIGTERM (the trainer ends its step, checkpoints and stops it) and ends when the
trainer asks or dies; an error in it, or its death, fails the run (FAILED, with the error) instead of a wait.
"""

from __future__ import annotations

import pickle
import queue
import signal
import traceback
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf
from torch import nn

from rlx_cli.config.choices import resolve_precision
from rlx_cli.engine.allocator import map_large_allocations
from rlx_cli.engine.engine import Engine
from rlx_cli.engine.models import Models
from rlx_cli.engine.precision import frozen_dtype
from rlx_cli.loops.build import Parts, build_task, components_of
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.groups import Groups, sample_groups
from rlx_cli.sampling.judge import judged

LIVENESS_S = 1.0  # how often a waiting side checks that the other is still alive
ERRORS = "train/reward_errors"


class SamplerFailed(RuntimeError):
    """The sampler process raised or died: the run fails with this."""


@dataclass
class Setup:
    """What the sampler process is started with: the resolved config, the sampling copy (shared memory), the sampler
    (with its tokenizer), the autocast dtype and the judge's dtype."""

    config: dict
    model: nn.Module
    sampler: object
    compute_dtype: torch.dtype | None
    judge_dtype: torch.dtype


class Ahead:
    """The sampler process and the step it is sampling; ``take`` is the loop's steps 1–2."""

    def __init__(self, cfg: DictConfig, parts: Parts):
        self.cfg, self.parts, self.behaviour = cfg, parts, parts.behaviour
        judge_dtype = frozen_dtype(resolve_precision(cfg.trainer.precision, parts.models.device), "auto")
        self.behaviour.model.share_memory()  # the trainer writes each version in, the sampler reads it
        context = mp.get_context("spawn")  # a fresh interpreter: no copy of the trainer's threads or locks
        self.requests, self.results = context.Queue(), context.Queue()
        config = OmegaConf.to_container(cfg, resolve=True)
        setup = Setup(config, self.behaviour.model, parts.sampler, parts.models.compute_dtype, judge_dtype)
        self.process = context.Process(
            target=serve, args=(setup, self.requests, self.results), name="rlx-sampler", daemon=True
        )  # a daemon: ended with the trainer, whatever stops it
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
        while True:
            try:
                kind, payload = self.results.get(timeout=LIVENESS_S)
                break
            except queue.Empty:
                cut = None
            except (EOFError, OSError, RuntimeError, pickle.UnpicklingError) as error:  # a batch cut off mid-way
                cut = error
                self.process.join(timeout=5.0)  # by the sampler's death: its pipe or shared memory gone
            if not self.process.is_alive():
                code = self.process.exitcode
                raise SamplerFailed(f"the sampler process (rollout.overlap) died at step {step}, exit code {code}")
            if cut is not None:
                raise cut
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

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(setup: Setup, requests, results) -> None:
    """The sampler process: answer each request (step, carried groups) with that step's sampled groups until the
    trainer sends None or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer stops after its step and then ends this process
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    map_large_allocations()  # as the trainer (loops/run.py): sampling's [rows, vocabulary] tensors leave no heap behind
    cfg = OmegaConf.create(setup.config)
    threads = cfg.rollout.threads or cfg.trainer.threads
    if threads:
        torch.set_num_threads(threads)
    parts = sampler_parts(cfg, setup)
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
        try:
            parts.task.reward_errors = 0  # this step's count: the trainer keeps the run's
            sampled = sample_groups(cfg, parts, step, parts.models.policy, carried)
        except Exception:  # noqa: BLE001 - any failure here fails the run, with its traceback
            results.put(("error", traceback.format_exc()))
            return
        results.put(("batch", (sampled, carried)))


def sampler_parts(cfg: DictConfig, setup: Setup) -> Parts:
    """The sampler process's Parts: the sampling copy as its policy, the task, the sampler; nothing that trains."""
    model = setup.model
    device = next(model.parameters()).device
    task = judged(build_task(cfg.task), cfg.task, device, setup.judge_dtype)
    tokenizer = setup.sampler.tokenizer
    models = Models(model, tokenizer, None, None, None, None, setup.compute_dtype)
    engine = Engine(models, micro_batch_tokens=cfg.trainer.micro_batch_tokens, strategy="ddp")
    return Parts(models, task, setup.sampler, components_of(cfg), None, None, None, engine)
