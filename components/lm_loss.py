"""Auxiliary language-model losses added to the policy loss as ``coef · lm_loss``."""

from __future__ import annotations

import torch
from torch import Tensor

from components.masked import as_bool, masked_count, masked_sum
from components.registry import register


@register("lm_loss", "positive_nll")
def positive_nll(logp: Tensor, mask: Tensor, positive: Tensor) -> Tensor:
    """Token-mean NLL of the positive (correct) responses, VAPO's positive-example LM loss (arXiv 2504.05118).

    ``logp``, ``mask``: ``[B, T]``; ``positive``: ``[B]`` bool. Returns Σ −logp·m over positive rows /
    their token count, a 0-d tensor; 0 (still attached to ``logp``'s graph) when no row is positive.
    """
    keep = _positive_tokens(mask, positive)
    return masked_sum(-logp, keep) / masked_count(keep).clamp(min=1)


def positive_token_count(mask: Tensor, positive: Tensor) -> Tensor:
    """Real tokens in positive rows, what ``positive_nll`` divides by; ``mask`` ``[B, T]``, ``positive`` ``[B]``."""
    return masked_count(_positive_tokens(mask, positive))


def _positive_tokens(mask: Tensor, positive: Tensor) -> Tensor:
    return as_bool(mask) & as_bool(positive).unsqueeze(-1)


@register("lm_loss", "none")
def none(logp: Tensor, mask: Tensor, positive: Tensor) -> Tensor:
    """No auxiliary loss: a 0-d zero on ``logp``'s graph, so ``backward`` still works."""
    return masked_sum(logp, torch.zeros_like(as_bool(mask)))
