"""Critic losses: regress values ``[B, T]`` onto returns ``[B, T]``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.loss_agg import MODES, aggregate
from components.masked import as_bool, masked_mean
from components.registry import register


@register("value_loss", "clipped", ranges={"clip": (0.0, math.inf)}, choices={"agg": MODES})
def clipped(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float = 0.2, agg: str = "token_mean"
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss, 0.5·agg(max((v − R)², (clip(v, v_old − clip, v_old + clip) − R)²)) -> (loss, metrics).

    ``values``, ``old_values``, ``returns``, ``mask``: ``[B, T]``. The pessimistic max of the plain and the
    clipped error follows the PPO2 baselines and verl ``compute_value_loss``; ``clip=None`` drops the
    clipped term. No gradient reaches ``old_values`` or ``returns``.

    Metrics: ``clip_frac`` (real tokens where the clipped error is the larger), ``value_mean``,
    ``return_mean``.
    """
    old_values, returns = old_values.detach(), returns.detach()
    errors = (values - returns) ** 2
    if clip is None:
        per_token, clip_hits = errors, torch.zeros_like(errors, dtype=torch.bool)
    else:
        clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
        clipped_errors = (clipped_values - returns) ** 2
        per_token, clip_hits = torch.maximum(errors, clipped_errors), clipped_errors > errors
    loss = 0.5 * aggregate(per_token, mask, mode=agg)
    with torch.no_grad():
        real = as_bool(mask)
        metrics = {
            "clip_frac": masked_mean(clip_hits.float(), real),
            "value_mean": masked_mean(values.detach(), real),
            "return_mean": masked_mean(returns, real),
        }
    return loss, metrics
