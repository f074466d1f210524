"""Policy-gradient surrogate losses over per-token log-probabilities.

Each loss returns ``(loss, metrics)``: a 0-d tensor to minimise and a dict of detached 0-d tensors.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.loss_agg import MODES, aggregate
from components.masked import as_bool, masked_mean
from components.registry import register


@register(
    "policy_loss",
    "ppo_clip",
    ranges={"eps_low": (0.0, 1.0), "eps_high": (0.0, 1.0), "clip_ratio_c": (1.0, math.inf)},
    choices={"agg": MODES},
)
def ppo_clip(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    agg: str = "token_mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (arXiv 1707.06347) with clip-higher and dual clip -> (loss, metrics).

    ``logp``, ``old_logp``, ``advantages``, ``mask``: ``[B, T]``. ratio = exp(clamp(logp − old_logp,
    −20, 20)) (verl's clamp, against overflow); per token L = max(−A·ratio, −A·clip(ratio, 1 − eps_low,
    1 + eps_high)); decoupled ``eps_high`` is DAPO's clip-higher (arXiv 2503.14476). For A < 0, L is also
    capped at −A·clip_ratio_c: the dual clip of Ye et al. (arXiv 1912.09729), for negative advantages
    only as in verl ``compute_policy_loss``. Aggregated by ``loss_agg.aggregate(mode=agg)``; no gradient
    reaches ``old_logp`` or ``advantages``.

    Metrics (fractions of real tokens): ``clip_frac_high`` (A > 0, ratio > 1 + eps_high),
    ``clip_frac_low`` (A < 0, ratio < 1 − eps_low), ``dual_clip_frac`` (A < 0, ratio > clip_ratio_c),
    ``approx_kl`` (mean of old_logp − logp, verl's ``ppo_kl``), ``ratio_mean``, ``ratio_max``.
    """
    advantages = advantages.detach()
    log_ratio = (logp - old_logp.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
    negative = advantages < 0
    per_token = torch.where(negative, torch.minimum(per_token, -advantages * clip_ratio_c), per_token)
    loss = aggregate(per_token, mask, mode=agg)

    with torch.no_grad():
        real = as_bool(mask)
        metrics = {
            "clip_frac_high": _fraction((advantages > 0) & (ratio > 1.0 + eps_high), real),
            "clip_frac_low": _fraction(negative & (ratio < 1.0 - eps_low), real),
            "dual_clip_frac": _fraction(negative & (ratio > clip_ratio_c), real),
            "approx_kl": masked_mean(-log_ratio, real),
            "ratio_mean": masked_mean(ratio, real),
            "ratio_max": torch.where(real, ratio, 0.0).amax() if real.any() else ratio.new_zeros(()),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def _fraction(hit: Tensor, real: Tensor) -> Tensor:
    return masked_mean(hit.float(), real)
