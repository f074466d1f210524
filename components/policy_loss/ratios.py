"""What the policy losses share: rollout-correction weights on a per-token loss, and the ratio metrics."""

from __future__ import annotations

from torch import Tensor

from components.masked import masked_max, masked_mean


def corrected(per_token: Tensor, weights: Tensor | None) -> Tensor:
    """``per_token`` ``[B, T]`` times the detached rollout-correction ``weights`` ``[B, T]`` (None: unchanged)."""
    return per_token if weights is None else per_token * weights.detach()


def ratio_metrics(advantages, log_ratio, ratio, real, eps_low=None, eps_high=None) -> dict[str, Tensor]:
    """``ppo_clip``'s ratio metrics over the real tokens (``[B, T]`` inputs), and its clip fractions when there is a
    clip range: ``clip_frac_high`` (A > 0, ratio > 1 + eps_high), ``clip_frac_low`` (A < 0, ratio < 1 − eps_low)."""
    metrics = {}
    if eps_low is not None:
        metrics["clip_frac_high"] = fraction((advantages > 0) & (ratio > 1.0 + eps_high), real)
        metrics["clip_frac_low"] = fraction((advantages < 0) & (ratio < 1.0 - eps_low), real)
    metrics["approx_kl"] = masked_mean(-log_ratio, real)
    metrics["ratio_mean"] = masked_mean(ratio, real)
    metrics["ratio_max"] = masked_max(ratio, real)
    return metrics


def fraction(hit: Tensor, real: Tensor) -> Tensor:
    """The share of the real tokens where ``hit`` holds (0-d)."""
    return masked_mean(hit.float(), real)
