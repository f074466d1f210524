"""The NaN/inf guard of every update: a non-finite loss or gradient is skipped, not applied, and counted;
more than ``trainer.max_skipped`` in a row stop the run (``Diverged``)."""

from __future__ import annotations

import os

import torch

from rlx_cli.engine import distributed
from rlx_cli.loops.checkpoint import TrainState


class Diverged(RuntimeError):
    """More than ``trainer.max_skipped`` updates in a row had a non-finite loss or gradient."""


def guarded_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
    """Step unless the loss or the gradient norm is NaN/inf on any process; then drop the gradients. -> whether it
    stepped."""
    if distributed.all_true(torch.isfinite(loss).item() and torch.isfinite(grad_norm).item()):
        optimizer.step()
        return True
    optimizer.zero_grad(set_to_none=True)
    return False


def count_update(state: TrainState, stepped: bool, max_skipped: int) -> None:
    """Count skipped updates; more than ``max_skipped`` in a row stop the run. No NaN/inf ever reaches the
    weights, so every checkpoint written so far is good."""
    if stepped:
        state.skipped_in_a_row = 0
        return
    state.skipped += 1
    state.skipped_in_a_row += 1
    if state.skipped_in_a_row > max_skipped:
        raise Diverged(
            f"{state.skipped_in_a_row} updates in a row had a non-finite loss or gradient "
            f"(more than trainer.max_skipped={max_skipped})"
        )


def nan_injected(step: int) -> bool:
    """Test hook: ``RLX_INJECT_NAN=step:N`` makes the loss of RL step N NaN, ``from:N`` of N and every later
    step, ``always`` of every step."""
    hook = os.environ.get("RLX_INJECT_NAN", "")
    kind, _, n = hook.partition(":")
    return hook == "always" or (kind == "step" and step == int(n)) or (kind == "from" and step >= int(n))
