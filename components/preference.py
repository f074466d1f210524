"""Preference losses on per-pair sequence log-probs, and the pairs a verifier makes of sampled groups.

``dpo`` follows TRL's ``DPOTrainer`` (``sigmoid`` and ``ipo`` losses, its logged rewards); ``best_worst`` is online
DPO's pair selection (TRL ``OnlineDPOTrainer`` with a verifier and G > 2 answers: best against worst of a group).
A sequence log-prob is the sum of a completion's token log-probs (prompt and padding excluded); IPO takes their
mean over the completion's tokens instead, as TRL's offline IPO does: ``sequence_logp`` computes either from
``[B, T]`` token log-probs, so a caller passes ``dpo`` what its ``kind`` needs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from components.masked import as_bool
from components.registry import register

LENGTH_AVERAGED = frozenset({"ipo"})  # kinds whose log-ratios are means over the completion's tokens


def sequence_logp(logp: Tensor, mask: Tensor, *, kind: str = "sigmoid") -> Tensor:
    """Per-row sequence log-probs ``[B]`` from token log-probs ``logp`` ``[B, T]`` over ``mask`` ``[B, T]``: the sum
    over real tokens, or their mean for a length-averaged ``kind`` (``ipo``; a row without tokens gives 0)."""
    real = as_bool(mask)
    total = torch.where(real, logp, torch.zeros((), dtype=logp.dtype, device=logp.device)).sum(-1)
    if kind not in LENGTH_AVERAGED:
        return total
    return total / real.sum(-1).clamp(min=1).to(total.dtype)


@register("preference", "dpo", ranges={"beta": (1e-6, math.inf)}, choices={"kind": ("sigmoid", "ipo")})
def dpo(
    chosen_logp: Tensor,
    rejected_logp: Tensor,
    ref_chosen_logp: Tensor,
    ref_rejected_logp: Tensor,
    *,
    beta: float = 0.1,
    kind: str = "sigmoid",
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO (Rafailov et al. 2023, arXiv 2305.18290) or IPO (Azar et al. 2023, arXiv 2310.12036) -> (loss, metrics).

    Every input is ``[P]``, one value per pair: the policy's and the reference's sequence log-probs of the chosen
    and the rejected completion. With Δ = (ℓ(y_w) − ℓ_ref(y_w)) − (ℓ(y_l) − ℓ_ref(y_l)), the loss is the mean over
    pairs of −log σ(β·Δ) (``sigmoid``; TRL's, without label smoothing) or (Δ − 1/(2β))² (``ipo``). For ``ipo`` the
    caller passes log-probs averaged over each completion's tokens (``sequence_logp(..., kind="ipo")``), as TRL's
    offline IPO; for ``sigmoid`` their sums. Metrics as TRL logs them, each a mean over pairs:
    ``rewards/chosen`` = β(ℓ(y_w) − ℓ_ref(y_w)), ``rewards/rejected`` likewise, ``rewards/margins`` their
    difference, ``rewards/accuracy`` the fraction with chosen > rejected (strictly).
    """
    chosen = chosen_logp - ref_chosen_logp
    rejected = rejected_logp - ref_rejected_logp
    delta = chosen - rejected
    losses = -F.logsigmoid(beta * delta) if kind == "sigmoid" else (delta - 1 / (2 * beta)) ** 2
    chosen_rewards, rejected_rewards = beta * chosen.detach(), beta * rejected.detach()
    metrics = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracy": (chosen_rewards > rejected_rewards).float().mean(),
    }
    return losses.mean(), metrics


def best_worst(scores: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, int]:
    """Online DPO's pairs from scored groups -> (chosen rows ``[P]``, rejected rows ``[P]``, tied groups).

    ``scores``, ``group_index``: ``[B]``. Per group (in order of group id) the chosen row is the first with the
    highest score and the rejected one the first with the lowest (ties: the first, as TRL); a group whose scores
    are all equal makes no pair and is counted as tied.
    """
    chosen, rejected, tied = [], [], 0
    for group in torch.unique(group_index).tolist():
        rows = (group_index == group).nonzero().squeeze(1)
        members = scores[rows]
        if members.max() == members.min():
            tied += 1
            continue
        chosen.append(rows[members.argmax()])
        rejected.append(rows[members.argmin()])
    empty = torch.zeros(0, dtype=torch.long, device=group_index.device)
    return (torch.stack(chosen) if chosen else empty), (torch.stack(rejected) if rejected else empty), tied
