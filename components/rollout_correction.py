"""Rollout correction: importance weights for samples drawn by a sampler other than the trainer's policy.

The sampler may be another engine (vLLM in bf16 against an fp32 trainer) or an older policy (``rollout.lag``); its
own log-probs of the tokens it drew, ``sampler_logp``, sit beside ``old_logp``, the trainer's log-probs of the same
tokens under the policy the update starts from (π_old). w = π_old / π_sampler = exp(old_logp − sampler_logp) per
token (``level="token"``) or its product over the sequence (``level="sequence"``), the log clamped at ±20 first
(verl ``rollout_corr_helper``). ``tis`` truncates w at ``cap`` (truncated importance sampling; TRL's
``token_truncate``), ``mis`` zeroes it outside [``lower``, ``upper``] (masked importance sampling, IcePop; TRL's
``token_mask``). The weights are detached and multiply every policy loss's per-token term
(``components/policy_loss``).

Each returns ``(weights [B, T], metrics)``, the weights 0 on padding; metrics are over the real tokens (at the
sequence level every token of a row carries its row's weight): ``weight_mean``, ``weight_max``, the share
truncated (``truncated_frac``) or masked (``masked_frac``), and ``ess``, the effective sample size as a share of
the tokens, (Σw)² / (N·Σw²) of the weights before truncation or masking (1 when they are all equal).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.masked import as_bool, masked_count, masked_max, masked_mean, masked_sum
from components.policy_loss.ratios import LOG_RATIO_CLAMP, clamped_ratio
from components.registry import register

LEVELS = ("token", "sequence")


@register("rollout_correction", "tis", choices={"level": LEVELS})  # cap > 0: rlx_cli/config/validate.py
def tis(
    old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, level: str = "token", cap: float = 2.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights min(w, ``cap``) ``[B, T]`` (``cap`` > 0) -> (weights, metrics).

    ``old_logp``: the trainer's log-probs of the sampled tokens under π_old, ``sampler_logp``: the sampler's,
    ``mask``: the real tokens, all ``[B, T]``. Metrics: ``weight_mean``, ``weight_max`` (after truncation),
    ``truncated_frac`` (w > cap), ``ess``.
    """
    real = as_bool(mask)
    raw = importance_weights(old_logp, sampler_logp, real, level)
    weights = torch.where(real, raw.clamp(max=cap), 0.0)
    metrics = {**weight_metrics(weights, raw, real), "truncated_frac": masked_mean((raw > cap).float(), real)}
    return weights, metrics


@register(
    "rollout_correction", "mis", ranges={"lower": (0.0, math.inf), "upper": (0.0, math.inf)}, choices={"level": LEVELS}
)
def mis(
    old_logp: Tensor,
    sampler_logp: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    lower: float = 0.5,
    upper: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Masked importance weights: w where ``lower`` ≤ w ≤ ``upper``, else 0 (``lower`` < ``upper``) ``[B, T]``
    -> (weights, metrics). Inputs as ``tis``. Metrics: ``weight_mean``, ``weight_max`` (after masking),
    ``masked_frac`` (w outside the band), ``ess``."""
    real = as_bool(mask)
    raw = importance_weights(old_logp, sampler_logp, real, level)
    inside = (raw >= lower) & (raw <= upper)
    weights = torch.where(real & inside, raw, 0.0)
    metrics = {**weight_metrics(weights, raw, real), "masked_frac": masked_mean((~inside).float(), real)}
    return weights, metrics


@register("rollout_correction", "none")
def none(old_logp: Tensor, sampler_logp: Tensor | None, mask: Tensor) -> tuple[None, dict[str, Tensor]]:
    """No correction: (None, no metrics); the policy loss takes its per-token term as it is. Inputs unused."""
    return None, {}


def importance_weights(old_logp: Tensor, sampler_logp: Tensor, real: Tensor, level: str) -> Tensor:
    """w = exp(clamp(old_logp − sampler_logp, ±20)) ``[B, T]`` per token, or (``sequence``) exp of the clamped row
    sum of the per-token log-ratios on every token of the row; detached, 1 on padding."""
    log_w = torch.where(real, clamped_ratio(old_logp.detach(), sampler_logp)[0], 0.0)
    if level == "sequence":
        log_w = masked_sum(log_w, real, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).unsqueeze(-1).expand_as(log_w)
    elif level != "token":
        raise ValueError(f"rollout_correction.level={level!r} is not valid (valid: {', '.join(LEVELS)})")
    return torch.exp(log_w)


def weight_metrics(weights: Tensor, raw: Tensor, real: Tensor) -> dict[str, Tensor]:
    """``weight_mean`` and ``weight_max`` of ``weights``, and ``ess`` of the ``raw`` ones, over the real tokens."""
    count = masked_count(real).clamp(min=1)
    ess = masked_sum(raw, real) ** 2 / (count * masked_sum(raw**2, real)).clamp(min=1e-30)
    return {"weight_mean": masked_mean(weights, real), "weight_max": masked_max(weights, real), "ess": ess}
