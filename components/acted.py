"""Did an ingredient act? One figure per VAPO ingredient, from the step's tensors (docs/metrics.md, "Did it act").

An ablation that switches an ingredient off can only matter where the ingredient had something to do. Each
function here measures that for one ingredient, so that a table can put beside a verdict "this ingredient changed
x% of tokens here" (the manipulation check, ``rlx report --stats``'s ``acted`` column):

- clip-higher: ``clip_higher_share``, the tokens the higher bound let through;
- length-adaptive λ: ``lam_range``, the spread of the per-row λ;
- value pretraining, decoupled GAE: ``first_token_bias``, the critic's bias at the first response token against the
  Monte-Carlo return (VC-PPO's diagnostic, arXiv 2503.01491);
- token-level loss: ``longest_quarter_share``, the loss weight carried by the longest quarter of the answers;
- positive-example NLL: ``groups_with_positive``, the groups it can learn from (and its share of the loss, which the
  objective logs);
- group sampling: ``distinct_prompts``, the prompts an optimizer update sees.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.masked import as_bool, masked_mean


def clip_higher_share(ratio: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float, eps_high: float) -> Tensor:
    """Share of real tokens (``mask`` [B, T]) with a positive advantage whose ``ratio`` [B, T] lies in
    (1 + eps_low, 1 + eps_high]: a symmetric clip at eps_low would have cut their gradient, the higher bound let it
    through -> 0-d; 0 when eps_high <= eps_low."""
    let_through = (advantages > 0) & (ratio > 1.0 + eps_low) & (ratio <= 1.0 + eps_high)
    return masked_mean(let_through.float(), mask)


def lam_range(lam: Tensor) -> tuple[float, float]:
    """The smallest and largest per-row λ of a step (``lam``: a float or [B]) -> (min, max)."""
    values = torch.as_tensor(lam, dtype=torch.float32).reshape(-1)
    return float(values.min()), float(values.max())


def first_token_bias(values: Tensor, token_rewards: Tensor, mask: Tensor) -> Tensor:
    """Mean over rows with an answer of V(first response token) − its Monte-Carlo return (``values``,
    ``token_rewards``, ``mask`` [B, T]; the return with γ = λ = 1 at the first token: the sum of the answer's token
    rewards), before the critic's update: positive, the critic expects more than the answer gets -> 0-d."""
    rows = as_bool(mask[:, 0])
    return masked_mean(values[:, 0] - (token_rewards * mask).sum(-1), rows)


def longest_quarter_share(row_weights: Tensor, lengths: Tensor) -> Tensor:
    """Share of the loss's weight (``row_weights`` [B]: each row's total weight in the aggregated loss, as
    ``loss_agg.row_weights`` gives it) carried by the ⌈B/4⌉ longest answers (``lengths`` [B]; ties by position)
    -> 0-d: 0.25 when every row weighs alike (a sequence mean), more when long answers weigh by their tokens."""
    count = math.ceil(len(lengths) / 4)
    longest = torch.sort(lengths, stable=True, descending=True).indices[:count]
    total = row_weights.sum()
    return row_weights[longest].sum() / total if total > 0 else torch.tensor(0.0)


def groups_with_positive(scores: Tensor, group_index: Tensor) -> Tensor:
    """Share of the step's groups (``group_index`` [B]) with at least one answer scoring above 0 (``scores`` [B]):
    the groups positive-example NLL has something to learn from -> 0-d."""
    groups = torch.unique(group_index)
    positive = torch.unique(group_index[scores > 0])
    return torch.tensor(len(positive) / max(1, len(groups)))


def distinct_prompts(group_index: Tensor, minibatches: list[Tensor]) -> float:
    """Mean over a step's optimizer updates (``minibatches``: each the row indices it holds) of the distinct prompts
    (``group_index`` [B]) an update sees."""
    seen = [len(torch.unique(group_index[rows])) for rows in minibatches]
    return sum(seen) / max(1, len(seen))
