"""Losses for updates far from the sampling policy: GSPO, CISPO, SAPO and GMPO (``geo_mean``).

verl's ``compute_policy_loss_{gspo,cispo,sapo,geo_mean}`` are the reference; where a paper or TRL differs, the
docstring says so. Every ratio is r = π_θ / π_old per token, from ``logp`` and ``old_logp`` ``[B, T]``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.loss_agg import MODES, aggregate
from components.masked import as_bool, masked_count, masked_mean, masked_sum
from components.policy_loss.ratios import (
    clamped_ratio,
    clip_fractions,
    corrected,
    fraction,
    ratio_metrics,
    reported,
    sequence_log_ratio,
    sequence_ratio_metrics,
)
from components.registry import register


@register(
    "policy_loss",
    "gspo",
    ranges={"eps_low": (0.0, 1.0), "eps_high": (0.0, math.inf)},
    choices={"agg": MODES},
    advantage_weighted=True,
)
def gspo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    agg: str = "seq_mean_token_mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071) with its token-level gradient -> (loss, metrics).

    ``[B, T]`` inputs. The sequence ratio s_i = exp(mean over the real tokens of log r) (no clamp inside the mean);
    per token s_i,t = exp(sg(log s_i) + logp − sg(logp)), its log clamped above at 10 (verl): the value is s_i, the
    gradient that of s_i·logp_t, so ∂L/∂logp_t = −A·s_i in an unclipped row. Per
    token L = max(−A·s_i,t, −A·clip(s_i,t, 1 − eps_low, 1 + eps_high)), times ``weights``, aggregated by
    ``loss_agg`` (the paper and verl: ``seq_mean_token_mean``; ε 3e-4 / 4e-4 are the paper's, for
    sequence-level advantages). No gradient reaches ``old_logp`` or ``advantages``.

    Metrics: ``clip_frac_high`` / ``clip_frac_low`` (real tokens with A > 0 and s > 1 + eps_high / A < 0 and
    s < 1 − eps_low: a whole row is clipped or not), ``seq_ratio_mean`` / ``seq_ratio_max`` (over real rows),
    ``approx_kl``, ``ratio_mean`` and ``ratio_max`` of the token ratios.
    """
    advantages = advantages.detach()
    real = as_bool(mask)
    seq_log_ratio = sequence_log_ratio(logp, old_logp, real)  # [B]
    log_s = (logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)
    s = torch.exp(log_s)
    per_token = torch.maximum(-advantages * s, -advantages * s.clamp(1.0 - eps_low, 1.0 + eps_high))
    loss = aggregate(corrected(per_token, weights), mask, mode=agg)
    return reported(loss, lambda: {
        **clip_fractions(advantages, s, real, 1.0 - eps_low, 1.0 + eps_high),
        **sequence_ratio_metrics(seq_log_ratio, real),
        **ratio_metrics(advantages, *clamped_ratio(logp, old_logp), real),
    })  # fmt: skip


@register(
    "policy_loss",
    "cispo",
    ranges={"eps_low": (0.0, 1.0), "eps_high": (0.0, math.inf)},
    choices={"agg": MODES},
    advantage_weighted=True,
)
def cispo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float | None = None,
    eps_high: float = 4.0,
    agg: str = "token_mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585) -> (loss, metrics).

    ``[B, T]`` inputs. Per token L = −sg(clip(r, 1 − eps_low, 1 + eps_high))·A·logp, r = exp(clamp(logp −
    old_logp, ±20)): every token keeps a gradient, −sg(r̂)·A·∇logp, the clip only bounds its weight. ``eps_low``
    None: no lower bound (MiniMax-M1, TRL; verl clips both sides); ``eps_high`` 4 caps r at 5, TRL's
    recommended ``epsilon_high`` (an absolute cap there). Times ``weights``, aggregated by ``loss_agg`` (the paper:
    a token-level mean).

    Metrics: ``clip_frac_high`` (real tokens with A ≠ 0 and r > 1 + eps_high: either sign, as the capped weight
    changes the gradient of both, where PPO's clip changes only A > 0's), ``clip_frac_low`` (A ≠ 0 and r < 1 −
    eps_low; 0 without a lower bound), ``approx_kl``, ``ratio_mean``, ``ratio_max``.
    """
    advantages = advantages.detach()
    log_ratio, ratio = clamped_ratio(logp, old_logp)
    low = None if eps_low is None else 1.0 - eps_low
    weight = ratio.detach().clamp(low, 1.0 + eps_high)
    per_token = -weight * advantages * logp
    loss = aggregate(corrected(per_token, weights), mask, mode=agg)
    real = as_bool(mask)
    below = torch.zeros_like(real) if low is None else ratio < low
    weighted = advantages != 0  # a token without advantage has no gradient for a bound to change
    return reported(loss, lambda: {
        "clip_frac_high": fraction(weighted & (ratio > 1.0 + eps_high), real),
        "clip_frac_low": fraction(weighted & below, real),
        **ratio_metrics(advantages, log_ratio, ratio, real),
    })  # fmt: skip


@register(
    "policy_loss",
    "sapo",
    ranges={"tau_pos": (1e-6, math.inf), "tau_neg": (1e-6, math.inf)},
    choices={"agg": MODES},
    advantage_weighted=True,
)
def sapo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: str = "seq_mean_token_mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (arXiv 2511.20347): a soft gate instead of a clip -> (loss, metrics).

    ``[B, T]`` inputs. Per token L = −f(r)·A with f(r) = σ(τ(r − 1))·4/τ, τ = ``tau_pos`` for A > 0 and
    ``tau_neg`` otherwise, r = exp(clamp(logp − old_logp, ±20)). At r = 1, f = 2/τ and f' = 1, so on-policy the
    gradient is PPO's; far from 1 it fades smoothly instead of stopping. Times ``weights``, aggregated by
    ``loss_agg`` (the paper and verl: ``seq_mean_token_mean``).

    Metrics: ``gate_slope_mean`` (mean over the real tokens of f'(r) = τ·σ(1 − σ)·4/τ = 4σ(1 − σ): for A ≠ 0 the
    share of the unclipped policy gradient the token keeps, 1 on-policy; a mean over every real token, as the
    engine averages metrics over micro-batches by their tokens), ``gate_slope_low_frac`` (real tokens with A ≠ 0
    whose share fell below a half), ``approx_kl``, ``ratio_mean``, ``ratio_max``.
    """
    advantages = advantages.detach()
    log_ratio, ratio = clamped_ratio(logp, old_logp)
    tau = torch.where(advantages > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -(gate * 4.0 / tau) * advantages
    loss = aggregate(corrected(per_token, weights), mask, mode=agg)
    real = as_bool(mask)
    slope = 4.0 * gate.detach() * (1.0 - gate.detach())
    weighted = advantages != 0  # a token without advantage has no gradient to keep a share of
    return reported(loss, lambda: {
        "gate_slope_mean": masked_mean(slope, real),
        "gate_slope_low_frac": fraction(weighted & (slope < 0.5), real),
        **ratio_metrics(advantages, log_ratio, ratio, real),
    })  # fmt: skip


@register(
    "policy_loss", "geo_mean", ranges={"eps_low": (0.0, math.inf), "eps_high": (0.0, math.inf)}, advantage_weighted=True
)
def geo_mean(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Geometric-Mean Policy Optimization, 2025): the geometric mean of the token ratios -> (loss, metrics).

    ``[B, T]`` inputs. The clip is sign-aware and in log space: for A > 0 log r is capped at ``eps_high``, for
    A < 0 floored at −``eps_low`` (for A = 0 it counts 0), so a clipped token has no gradient. Per row
    ρ_i = exp(mean over the real tokens of the clipped log r), Ā_i the mean advantage over them (the paper's
    advantages are per sequence), L_i = −Ā_i·ρ_i; the loss is the mean over the rows with a real token (verl
    divides by every row). ``weights`` ``[B, T]`` enter per row as their geometric mean over the real tokens,
    as in verl. The engine weights micro-batches by rows: ``loss_agg.mode`` must be ``seq_mean_token_mean``.

    Metrics: ``clip_frac_high`` / ``clip_frac_low`` (real tokens with A > 0 and log r > eps_high / A < 0 and
    log r < −eps_low), ``seq_ratio_mean`` / ``seq_ratio_max`` (as GSPO's: the geometric mean of the unclipped token
    ratios over real rows; ρ is its clipped counterpart), ``approx_kl``, ``ratio_mean``, ``ratio_max``.
    """
    advantages = advantages.detach()
    difference = logp - old_logp.detach()
    real = as_bool(mask)
    sign = torch.sign(advantages)
    clipped = sign * torch.minimum(sign * difference, sign * difference.clamp(-eps_low, eps_high))
    tokens = masked_count(real, dim=-1).clamp(min=1)
    rho = torch.exp(masked_sum(clipped, real, dim=-1) / tokens)  # [B]
    mean_advantage = masked_sum(advantages, real, dim=-1) / tokens
    per_row = -mean_advantage * rho
    if weights is not None:
        per_row = per_row * torch.exp(masked_sum(torch.log(weights.detach() + 1e-10), real, dim=-1) / tokens)
    rows = real.any(-1)
    loss = masked_sum(per_row, rows) / masked_count(rows).clamp(min=1)
    return reported(loss, lambda: {
        **clip_fractions(advantages, difference, real, -eps_low, eps_high),
        **sequence_ratio_metrics(sequence_log_ratio(logp, old_logp, real), real),
        **ratio_metrics(advantages, *clamped_ratio(logp, old_logp), real),
    })  # fmt: skip
