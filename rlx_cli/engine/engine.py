"""The engine under the loop: how each pass runs, whatever the model's size, precision or number of processes.

- Every forward and backward runs over micro-batches of at most ``trainer.micro_batch_tokens`` tokens
  (``microbatch.py``); the no-gradient forwards (old and reference log-probs, values) put their results back in
  the batch's row order.
- Sampling runs in eval mode under the precision's autocast; under ``trainer.strategy=fsdp`` the policy is first
  gathered whole on every process, so each samples on its own (``sharding.py``).
- Backward, the gradients' sum over processes, clipping and optimizers follow ``trainer.strategy``
  (``sharding.py``); the loop and its components see plain ``[B, T]`` tensors of one micro-batch.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from rlx_cli.engine import distributed, sharding
from rlx_cli.engine.allocator import SAMPLED_BYTES, map_large_allocations
from rlx_cli.engine.batch import Rollout
from rlx_cli.engine.microbatch import MicroBatch, place, split
from rlx_cli.engine.models import Models, evaluating
from rlx_cli.engine.precision import autocast


class Engine:
    """Micro-batched forwards, sampling and the update's mechanics for ``models`` under one strategy."""

    def __init__(self, models: Models, *, micro_batch_tokens: int, strategy: str, loss_scale: float = 1.0):
        self.models = models
        self.budget = micro_batch_tokens
        self.loss_scale = loss_scale  # trainer.loss_scale: 1 + 2^-20 is a study's no-op control
        self.strategy = strategy if distributed.size() > 1 else "ddp"  # one process: plain replicas whatever asked
        if self.strategy == "fsdp":
            sharding.shard(models)

    # -- sampling -------------------------------------------------------------------------------------------
    @contextmanager
    def sampling(self):
        """Inside it, ``generate`` (and a vLLM sync) may use the policy: eval mode, autocast, whole weights, and
        host allocations of 1 MiB and more mapped (``map_large_allocations``).

        A decode step allocates its [rows, vocabulary] tensors anew at every token, and keeps each token's small
        tensors to the end of the decode; cut from a freed [rows, vocabulary] block (glibc's best fit), such a small
        block leaves it too short for the next token's, and the heap grew by up to 150 MiB in one decode of 16 rows
        at a 32,000 vocabulary (2 MiB a tensor), or not at all, by the heap's state when it began: identical runs
        peaked at 878 to 1,024 MiB (docs/benchmarks.md, Peak memory); mapped, at 871 to 876."""
        models = self.models
        gathered = sharding.gathered(models.scorer) if self.strategy == "fsdp" else nullcontext()
        map_large_allocations(SAMPLED_BYTES)
        try:
            with evaluating(models.policy), autocast(models.compute_dtype, models.device), gathered:
                yield
        finally:
            map_large_allocations()

    # -- forwards without gradients ------------------------------------------------------------------------
    def micro_batches(self, batch: Rollout, forward_only: Tensor | None = None) -> list[MicroBatch]:
        """``batch`` under the token budget (``forward_only`` [B] bool: rows that run no backward, apart and first:
        ``microbatch.split``); under FSDP every process runs as many of each kind as the one with the most (each
        forward gathers weights collectively, each backward reduces gradients), the extra ones empty
        (``MicroBatch.padding``)."""
        micro = split(batch, self.budget, forward_only)
        if self.strategy == "fsdp":
            kinds = (False,) if forward_only is None else (True, False)
            micro = [mb for kind in kinds for mb in pad_to_largest(micro, kind)]
        return micro

    @torch.no_grad()
    def logp(self, batch: Rollout, temperature: float, *, reference: bool = False) -> Tensor:
        """Response log-probs [B, T] under the policy, or the reference with ``reference=True``."""
        models = self.models
        scorer = models.reference_scorer if reference else models.scorer
        with models.reference_context() if reference else nullcontext(), evaluating(models.policy):
            micro = self.micro_batches(batch)
            return place([scorer(m.batch, temperature)[0] for m in micro], micro, tuple(batch.response_mask.shape))

    @torch.no_grad()
    def values(self, batch: Rollout) -> Tensor:
        """The critic's values [B, T]."""
        micro = self.micro_batches(batch)
        return place([self.models.critic(m.batch) for m in micro], micro, tuple(batch.response_mask.shape))

    # -- the update's mechanics ----------------------------------------------------------------------------
    def backward(self, objective: Tensor) -> None:
        """Backpropagate this process's part of the loss (FSDP averages gradients over processes: scaled back), times
        ``loss_scale``."""
        (objective * (self.loss_scale * (distributed.size() if self.strategy == "fsdp" else 1))).backward()

    def step_gradients(self, optimizer: torch.optim.Optimizer, params: list, max_norm: float | None) -> Tensor:
        """Sum ``optimizer``'s gradients over processes, clip their norm to ``max_norm`` -> the norm before."""
        sharding.reduce_gradients(optimizer, self.strategy)
        return sharding.clip_gradients(params, max_norm or float("inf"))


def pad_to_largest(micro: list[MicroBatch], forward_only: bool) -> list[MicroBatch]:
    """``micro``'s micro-batches of one kind (``forward_only`` or not), padded with empty stand-ins to the most that
    any process has of that kind (a collective: every process calls it)."""
    mine = [mb for mb in micro if mb.forward_only == forward_only]
    stand_in = MicroBatch.empty_like(micro[0], forward_only)
    return mine + [stand_in] * (distributed.largest(len(mine)) - len(mine))
