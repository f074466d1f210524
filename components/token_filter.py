"""Which response tokens carry the policy gradient: a ``[B, T]`` bool selection inside ``mask``.

The engine multiplies the per-token policy loss by the selection; the YAML's wiring key ``normalizer`` says what
``loss_agg`` divides by: ``selected`` (the selected tokens, as the authors' code) or ``all`` (every real token,
as TRL's ``top_entropy_quantile``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from components.masked import as_bool, masked_count, masked_mean, masked_top_k, share_count
from components.registry import register

NORMALIZERS = ("selected", "all")


@register("token_filter", "none")
def none(mask: Tensor) -> Tensor:
    """Every real token: ``mask`` ``[B, T]`` as a bool tensor."""
    return as_bool(mask)


@register("token_filter", "high_entropy", ranges={"top_ratio": (0.0, 1.0)})
def high_entropy(entropy: Tensor, mask: Tensor, *, top_ratio: float = 0.2) -> Tensor:
    """The 80/20 rule's forking tokens (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv 2506.01939; the
    authors' verl fork, ``get_global_entropy_top_mask``) -> ``[B, T]`` bool.

    ``entropy``, ``mask``: ``[B, T]``; ``entropy`` is the current policy's per-token entropy of the whole
    next-token distribution at the rollout temperature. Selects the top k = max(1, ⌈N·top_ratio⌉) of the N real
    tokens by entropy, pooled across rows: the authors' top-k (their ⌈·⌉ is ``int(x + 0.9999)``; here ⌈·⌉ of
    N·top_ratio rounded to 9 places). Exactly k tokens, unlike TRL's quantile threshold, which keeps every tie.
    Ties are broken by position: among equal entropies the earlier token in row-major order (lower row, then
    earlier position) is taken (``masked.masked_top_k``). Padding is never selected; an empty ``mask`` selects
    nothing. The pool is exactly the tensors passed in: rlx passes one micro-batch (this process's rows of a
    minibatch, at most ``trainer.micro_batch_tokens`` tokens; the whole minibatch when it fits).
    """
    count = int(masked_count(mask))
    if count == 0:
        return torch.zeros_like(as_bool(mask))
    return masked_top_k(entropy, mask, max(1, share_count(count, top_ratio, round_up=True)))


@register("token_filter", "low_probability", ranges={"prob_threshold": (0.0, 1.0)})
def low_probability(old_logp: Tensor, mask: Tensor, *, prob_threshold: float = 0.9) -> Tensor:
    """SPO's trainer (Guo et al. 2025; AIFrameResearch/SPO): the policy gradient only on the tokens the sampling
    policy drew with probability p < ``prob_threshold`` -> ``[B, T]`` bool.

    ``old_logp``, ``mask``: ``[B, T]``; p = exp(old_logp), the log-probs of the policy that sampled the batch at the
    rollout temperature. With ``normalizer=selected`` the loss is divided by the selected tokens' count.
    """
    return as_bool(mask) & (old_logp.detach().exp() < prob_threshold)


def selection_metrics(entropy: Tensor, mask: Tensor, selected: Tensor) -> dict[str, Tensor]:
    """``selected_frac`` (selected share of the real tokens) and ``selected_entropy`` (their mean entropy),
    detached 0-d tensors; ``entropy``, ``mask``, ``selected``: ``[B, T]``."""
    with torch.no_grad():
        real = as_bool(mask)
        chosen = as_bool(selected) & real
        return {
            "selected_frac": masked_mean(chosen.float(), real),
            "selected_entropy": masked_mean(entropy.detach(), chosen),
        }
