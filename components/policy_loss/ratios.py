"""What the policy losses share: the clamped ratio, rollout-correction weights on a per-token loss, the ratio
metrics and the clip fractions, and the ``(loss, metrics)`` they return. Their meanings, one per name across every
loss: docs/metrics.md."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from components import acted
from components.masked import masked_count, masked_max, masked_mean, masked_sum

LOG_RATIO_CLAMP = 20.0  # verl's clamp of log r, against overflow in exp


def clamped_ratio(logp: Tensor, old_logp: Tensor) -> tuple[Tensor, Tensor]:
    """(log r, r) ``[B, T]``: log r = clamp(logp − sg(old_logp), −20, 20), r = exp(log r); the gradient flows
    through ``logp`` only (0 where the clamp is active)."""
    log_ratio = (logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_ratio, torch.exp(log_ratio)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, real: Tensor) -> Tensor:
    """log s ``[B]``: the mean over each row's real tokens of logp − sg(old_logp), unclamped (GSPO's sequence
    ratio s is its exp, the geometric mean of the token ratios); 0 for a row without a real token."""
    return masked_sum(logp - old_logp.detach(), real, dim=-1) / masked_count(real, dim=-1).clamp(min=1)


def sequence_ratio_metrics(seq_log_ratio: Tensor, real: Tensor) -> dict[str, Tensor]:
    """``seq_ratio_mean`` and ``seq_ratio_max`` of s = exp(min(log s, 10)) over the rows with a real token
    (``seq_log_ratio`` [B], ``real`` [B, T])."""
    rows = real.any(-1)
    seq_ratio = torch.exp(seq_log_ratio.detach().clamp(max=10.0))
    return {"seq_ratio_mean": masked_mean(seq_ratio, rows), "seq_ratio_max": masked_max(seq_ratio, rows)}


def corrected(per_token: Tensor, weights: Tensor | None) -> Tensor:
    """``per_token`` ``[B, T]`` times the detached rollout-correction ``weights`` ``[B, T]`` (None: unchanged)."""
    return per_token if weights is None else per_token * weights.detach()


def ratio_metrics(advantages, log_ratio, ratio, real, eps_low=None, eps_high=None) -> dict[str, Tensor]:
    """The token-ratio metrics every policy loss logs, over the real tokens (``[B, T]`` inputs): ``approx_kl``,
    ``ratio_mean``, ``ratio_max``; and with a clip range PPO's clip fractions of the token ratios (``clip_fractions``
    at 1 − eps_low and 1 + eps_high) and ``clip_higher_share``, the tokens the higher bound let through
    (``acted.clip_higher_share``: did clip-higher act?)."""
    metrics = {}
    if eps_low is not None:
        metrics.update(clip_fractions(advantages, ratio, real, 1.0 - eps_low, 1.0 + eps_high))
        metrics["clip_higher_share"] = acted.clip_higher_share(ratio, advantages, real, eps_low=eps_low,
                                                               eps_high=eps_high)  # fmt: skip
    metrics["approx_kl"] = masked_mean(-log_ratio, real)
    metrics["ratio_mean"] = masked_mean(ratio, real)
    metrics["ratio_max"] = masked_max(ratio, real)
    return metrics


def clip_fractions(advantages: Tensor, clipped: Tensor, real: Tensor, low: float, high: float) -> dict[str, Tensor]:
    """PPO's clip fractions, the real tokens whose gradient a bound removed (``[B, T]`` inputs): ``clip_frac_high``
    (A > 0, ``clipped`` > ``high``) and ``clip_frac_low`` (A < 0, ``clipped`` < ``low``), ``clipped`` being what the
    loss clips: the token ratio (PPO), GSPO's sequence ratio, GMPO's log-ratio (its bounds ± eps)."""
    return {
        "clip_frac_high": fraction((advantages > 0) & (clipped > high), real),
        "clip_frac_low": fraction((advantages < 0) & (clipped < low), real),
    }


def fraction(hit: Tensor, real: Tensor) -> Tensor:
    """The share of the real tokens where ``hit`` holds (0-d)."""
    return masked_mean(hit.float(), real)


def reported(loss: Tensor, metrics: Callable[[], dict[str, Tensor]]) -> tuple[Tensor, dict[str, Tensor]]:
    """What every policy loss returns: ``(loss, metrics())``, the metrics computed without a graph and detached
    (0-d tensors)."""
    with torch.no_grad():
        return loss, {k: v.detach() for k, v in metrics().items()}
