"""PPO's clipped surrogate and the two losses built on it that restrain the tokens whose centred covariance drives
entropy down, ``clip_cov`` and ``kl_cov`` (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv 2505.22617); and ``none``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.loss_agg import MODES, aggregate
from components.masked import as_bool, masked_count, masked_mean, masked_sum, masked_top_k, share_count
from components.policy_loss.ratios import clamped_ratio, corrected, fraction, ratio_metrics, reported
from components.registry import register


@register(
    "policy_loss",
    "ppo_clip",
    ranges={"eps_low": (0.0, 1.0), "eps_high": (0.0, 1.0), "clip_ratio_c": (1.0, math.inf)},
    choices={"agg": MODES},
    advantage_weighted=True,
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
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (arXiv 1707.06347) with clip-higher and dual clip -> (loss, metrics).

    ``logp``, ``old_logp``, ``advantages``, ``mask``: ``[B, T]``. ratio = exp(clamp(logp − old_logp,
    −20, 20)) (verl's clamp, against overflow); per token L = max(−A·ratio, −A·clip(ratio, 1 − eps_low,
    1 + eps_high)); decoupled ``eps_high`` is DAPO's clip-higher (arXiv 2503.14476). For A < 0, L is also
    capped at −A·clip_ratio_c: the dual clip of Ye et al. (arXiv 1912.09729), for negative advantages
    only as in verl ``compute_policy_loss``. ``weights`` ``[B, T]`` (``rollout_correction``, detached) multiply
    each token's L; then ``loss_agg.aggregate(mode=agg)``. No gradient reaches ``old_logp`` or ``advantages``.

    Metrics (fractions of real tokens): ``clip_frac_high`` (A > 0, ratio > 1 + eps_high),
    ``clip_frac_low`` (A < 0, ratio < 1 − eps_low), ``dual_clip_frac`` (A < 0, ratio > clip_ratio_c),
    ``approx_kl`` (mean of old_logp − logp, verl's ``ppo_kl``), ``ratio_mean``, ``ratio_max``.
    """
    advantages = advantages.detach()
    log_ratio, ratio = clamped_ratio(logp, old_logp)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
    negative = advantages < 0
    per_token = torch.where(negative, torch.minimum(per_token, -advantages * clip_ratio_c), per_token)
    loss = aggregate(corrected(per_token, weights), mask, mode=agg)
    real = as_bool(mask)
    return reported(loss, lambda: {
        **ratio_metrics(advantages, log_ratio, ratio, real, eps_low, eps_high),
        "dual_clip_frac": fraction(negative & (ratio > clip_ratio_c), real),
    })  # fmt: skip


@register(
    "policy_loss",
    "clip_cov",
    ranges={
        "eps_low": (0.0, 1.0),
        "eps_high": (0.0, 1.0),
        "clip_cov_ratio": (0.0, 1.0),
        "clip_cov_lb": (-math.inf, math.inf),
        "clip_cov_ub": (-math.inf, math.inf),
    },
    choices={"agg": MODES},
)
def clip_cov(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    agg: str = "token_mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; verl ``compute_policy_loss_clip_cov``) -> (loss, metrics).

    ``logp``, ``old_logp``, ``advantages``, ``mask``: ``[B, T]``. Per token the clipped PPO loss
    L = max(−A·r, −A·clip(r, 1 − eps_low, 1 + eps_high)), r = exp(clamp(logp − old_logp, −20, 20)), with no dual
    clip. Cov_i = (A_i − Ā)(ℓ_i − ℓ̄), ℓ = ``logp`` detached, Ā and ℓ̄ plain means over the N real tokens.
    Candidates: real tokens with clip_cov_lb < Cov_i < clip_cov_ub (strict) that PPO's clip has not already
    clipped (−A·clip(r) > −A·r). A uniformly random subset of min(max(⌊clip_cov_ratio·N⌋, 1), #candidates) of
    them gets L_i · 0 (no gradient) but stays in the ``loss_agg`` denominator. The paper's scripts set
    eps_low = eps_high = 1 (``conf/algo/clip_cov.yaml``). ``weights`` ``[B, T]`` (``rollout_correction``) multiply
    each L_i before aggregation.

    Statistics cover exactly the tensors passed in: Ā, ℓ̄, N and the pick pool every real token of the ``[B, T]``
    batch (across rows and prompts), so they depend on how the engine splits a step into calls. rlx calls it once
    per micro-batch: the rows of a minibatch that one process holds, cut to at most ``trainer.micro_batch_tokens``
    tokens (one call per minibatch when they fit, as on the built-in tasks); verl likewise on one micro-batch.

    Randomness: one ``torch.randperm(#candidates)`` from torch's global CPU generator per call with a candidate
    (none without). The engine seeds that generator from ``seed`` and restores it on resume, so the picks are
    reproducible from the run's seed, the same on CPU and GPU.

    Metrics (fractions of real tokens): ``cov_frac`` (the picked tokens), ``cov_candidate_frac``,
    ``cov_mean`` (mean Cov_i, the batch covariance of A and ℓ), and as ``ppo_clip``: ``clip_frac_high``,
    ``clip_frac_low``, ``approx_kl``, ``ratio_mean``, ``ratio_max``.
    """
    advantages = advantages.detach()
    log_ratio, ratio = clamped_ratio(logp, old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        real = as_bool(mask)
        cov = centred_covariance(advantages, logp, real)
        candidates = real & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        count = max(share_count(int(masked_count(real)), clip_cov_ratio), 1)
        picked = random_subset(candidates, count)
    per_token = torch.where(picked, torch.zeros((), dtype=per_token.dtype, device=per_token.device), per_token)
    loss = aggregate(corrected(per_token, weights), mask, mode=agg)
    return reported(loss, lambda: {
        "cov_frac": fraction(picked, real),
        "cov_candidate_frac": fraction(candidates, real),
        "cov_mean": masked_mean(cov, real),
        **ratio_metrics(advantages, log_ratio, ratio, real, eps_low, eps_high),
    })  # fmt: skip


@register(
    "policy_loss",
    "kl_cov",
    ranges={"kl_cov_ratio": (0.0, 1.0), "kl_coef": (0.0, math.inf)},
    choices={"agg": MODES},
)
def kl_cov(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    kl_cov_ratio: float = 2e-3,
    kl_coef: float = 1.0,
    agg: str = "token_mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl ``compute_policy_loss_kl_cov``) -> (loss, metrics).

    ``logp``, ``old_logp``, ``advantages``, ``mask``: ``[B, T]``. Per token L = −A·r with
    r = exp(clamp(logp − old_logp, −20, 20)) and no ratio clipping anywhere; the top max(1, ⌊kl_cov_ratio·N⌋) real
    tokens by Cov_i = (A_i − Ā)(ℓ_i − ℓ̄) (largest first; ℓ = ``logp`` detached, Ā and ℓ̄ plain means over the N
    real tokens) get L_i = −A_i·r_i + kl_coef·|logp_i − old_logp_i|, the absolute log-ratio (unclamped).
    On-policy (logp = old_logp) the penalty and its gradient are 0. Defaults: the paper's 7B scripts
    (k = 0.2 %, β = 1; verl's config default β = 0.1 differs). ``weights`` ``[B, T]`` (``rollout_correction``)
    multiply each L_i; then ``loss_agg.aggregate(mode=agg)``.

    Statistics cover exactly the tensors passed in: Ā, ℓ̄, N and the top-k pool every real token of the
    ``[B, T]`` batch (across rows and prompts); rlx calls it once per micro-batch (this process's rows of a
    minibatch, at most ``trainer.micro_batch_tokens`` tokens), verl likewise. Ties in Cov are broken by position
    (the earlier token in row-major order is taken; ``masked.masked_top_k``), so the selection is deterministic; no
    randomness.

    Metrics (fractions of real tokens): ``cov_frac`` (the penalised tokens), ``cov_mean`` (mean Cov_i, the batch
    covariance of A and ℓ), ``abs_kl`` (mean |logp − old_logp|, verl's ``ppo_kl_abs``), and as ``ppo_clip``:
    ``approx_kl``, ``ratio_mean``, ``ratio_max``.
    """
    advantages = advantages.detach()
    difference = logp - old_logp.detach()
    log_ratio, ratio = clamped_ratio(logp, old_logp)
    with torch.no_grad():
        real = as_bool(mask)
        cov = centred_covariance(advantages, logp, real)
        count = max(share_count(int(masked_count(real)), kl_cov_ratio), 1)
        picked = masked_top_k(cov, real, count)
    penalty = torch.where(picked, kl_coef * difference.abs(), torch.zeros((), dtype=ratio.dtype, device=ratio.device))
    per_token = -advantages * ratio + penalty
    loss = aggregate(corrected(per_token, weights), mask, mode=agg)
    return reported(loss, lambda: {
        "cov_frac": fraction(picked, real),
        "cov_mean": masked_mean(cov, real),
        "abs_kl": masked_mean(difference.abs(), real),
        **ratio_metrics(advantages, log_ratio, ratio, real),
    })  # fmt: skip


@register("policy_loss", "none", choices={"agg": MODES})
def none(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str = "token_mean"
) -> tuple[Tensor, dict[str, Tensor]]:
    """No policy-gradient term -> (a 0-d zero on ``logp``'s graph, no metrics); ``[B, T]`` inputs unused.

    For the methods of DeepSeekMath's unified paradigm (arXiv 2402.03300, §5.2.1) whose gradient coefficient is
    the LM loss alone: online RFT and RFT put ``lm_loss=positive_nll`` (coef 1) beside it.
    """
    return masked_sum(logp, torch.zeros_like(as_bool(mask))), {}


def centred_covariance(advantages: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """Cov_i = (A_i − Ā)(ℓ_i − ℓ̄) ``[B, T]``, Ā and ℓ̄ plain means over the real tokens of ``mask`` (all rows
    pooled; not per sequence or group), ``logp`` detached (Cui et al. 2025, eq. for Clip-Cov/KL-Cov)."""
    logp = logp.detach()
    return (advantages - masked_mean(advantages, mask)) * (logp - masked_mean(logp, mask))


def random_subset(candidates: Tensor, count: int) -> Tensor:
    """A uniformly random subset of min(count, Σcandidates) of the true entries -> bool, ``candidates``' shape.

    One ``torch.randperm`` over the candidates in row-major order, from torch's global CPU generator (seeded by
    the engine), whenever there is a candidate; no draw otherwise.
    """
    flat = candidates.flatten()
    positions = flat.nonzero().squeeze(1)
    picked = torch.zeros_like(flat)
    if len(positions):
        order = torch.randperm(len(positions), generator=torch.default_generator, device="cpu")
        picked[positions[order[:count].to(positions.device)]] = True
    return picked.view(candidates.shape)
