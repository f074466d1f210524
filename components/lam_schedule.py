"""GAE λ of the policy, one per response: ``lengths`` ``[B]`` -> ``[B]`` float.

The critic's λ is a wiring key in YAML (``critic_lam``; null means the policy's λ per row), so
``coupled`` and ``decoupled`` share one body and differ only in their YAML.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.registry import register


@register("lam_schedule", "coupled", ranges={"policy_lam": (0.0, 1.0)})
def coupled(lengths: Tensor, *, policy_lam: float = 0.95) -> Tensor:
    """One λ for policy and critic (standard PPO, GAE λ = 0.95) -> ``[B]``."""
    return torch.full(lengths.shape, policy_lam, dtype=torch.get_default_dtype(), device=lengths.device)


@register("lam_schedule", "decoupled", ranges={"policy_lam": (0.0, 1.0)})
def decoupled(lengths: Tensor, *, policy_lam: float = 0.95) -> Tensor:
    """Decoupled GAE (VC-PPO, arXiv 2503.01491): policy λ = 0.95, critic λ = 1 from YAML -> ``[B]``."""
    return coupled(lengths, policy_lam=policy_lam)


@register("lam_schedule", "length_adaptive", ranges={"alpha": (1e-6, math.inf)})
def length_adaptive(lengths: Tensor, *, alpha: float = 0.5) -> Tensor:
    """Length-adaptive GAE (VAPO, arXiv 2504.05118): λ = 1 − 1/(α·l), clamped to [0, 1] -> ``[B]``.

    ``lengths``: ``[B]`` response lengths l (long or float); l = 0 gives 0. Summaries of VAPO disagree
    on α: 0.05 fits its thousand-token answers (λ = 0.98 at l = 1000) but gives λ ≤ 0.5 below 40
    tokens; the default here, 0.5, gives λ 0.8–0.97 for the 10–60-token answers of small models.
    Set ``lam_schedule.alpha=0.05`` for long answers.
    """
    scaled = alpha * lengths.to(torch.get_default_dtype())
    lam = 1.0 - 1.0 / scaled.clamp(min=torch.finfo(scaled.dtype).tiny)
    return torch.where(scaled > 0, lam, torch.zeros_like(lam)).clamp(0.0, 1.0)
