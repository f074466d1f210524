"""Per-token estimators of KL(π_θ ‖ π_ref) from sampled tokens (Schulman, "Approximating KL
Divergence", 2020: k1, k2, k3). The engine multiplies by ``kl.coef`` and puts it in the reward or the loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from components.registry import register

KINDS = ("k1", "abs", "k2", "k3")


@register("kl", "estimate", choices={"kind": KINDS})
def estimate(logp: Tensor, ref_logp: Tensor, *, kind: str = "k3") -> Tensor:
    """Per-token KL estimate ``[B, T]`` from ``logp``, ``ref_logp`` ``[B, T]`` (mask it downstream).

    k1 = logp − ref (unbiased, can be negative; PPO-max / InstructGPT's in-reward penalty);
    abs = |k1|; k2 = ½·k1² (REINFORCE++ with baseline, KL in the loss);
    k3 = exp(ref − logp) − (ref − logp) − 1 (unbiased, ≥ 0; GRPO's loss term). For k3 the log-ratio is
    clamped to ±20 and the result to ±10, as verl ``kl_penalty`` ("low_var_kl") does against overflow.
    """
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        ref_minus_logp = (-log_ratio).clamp(-20.0, 20.0)
        return (torch.exp(ref_minus_logp) - ref_minus_logp - 1).clamp(-10.0, 10.0)
    raise ValueError(f"kl.kind={kind!r} is not valid (valid: {', '.join(KINDS)})")


@register("kl", "none")
def none(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """No KL term: zeros ``[B, T]`` (DAPO, VAPO and VC-PPO train without a reference penalty)."""
    return torch.zeros_like(logp)
