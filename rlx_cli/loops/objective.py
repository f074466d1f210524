"""The policy's objective on one micro-batch, term by term, and the rows that need no backward under it.

The objective is the sum of the ``TERMS`` this config turns on: the policy gradient (on the token filter's
selection, times the rollout correction's weights), an entropy bonus, KL to the reference in the loss, and the LM
loss on positive samples. Each ``Term`` also says whether it *spares* a row whose advantages are all 0: whether that
row gets exactly no gradient from it, whatever the other rows of its micro-batch. ``micro_objective`` adds the
terms; ``forward_only_rows`` lets rows skip their backward only when every term that is on spares them. Both read
the one list, so a term added to it is counted by both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from components import registry
from components import token_filter as filters
from components.loss_agg import aggregate, denominator


@dataclass(frozen=True)
class Shares:
    """One micro-batch's weights in its minibatch's objective: of the loss normaliser (``loss_agg.denominator``)
    and of the positive samples' tokens (the LM loss's)."""

    loss: float
    positive: float


@dataclass(frozen=True)
class Term:
    """One term of the policy's objective: whether this config has it, whether it spares rows without advantage,
    and its value on a micro-batch (``t``: the micro-batch's ``[b, t]`` tensors by name, ``entropy`` among them)
    -> (its weighted share of the minibatch's objective, its metrics)."""

    name: str
    on: Callable[[object, dict], bool]  # (cfg, components)
    spares_rows_without_advantage: Callable[[object, dict], bool]  # (cfg, components)
    value: Callable[[dict, dict, Shares, str], tuple[Tensor, dict[str, float]]]  # (components, t, shares, agg mode)


def policy_gradient(comp: dict, t: dict, shares: Shares, agg_mode: str) -> tuple[Tensor, dict[str, float]]:
    """The policy loss on the token filter's selection (from the current policy's ``entropy`` or the sampling
    policy's ``old_logp``), its per-token term times the rollout correction's weights (π_old / π_sampler, from
    ``old_logp`` and the sampler's own ``sampler_logp``). The filter's ``normalizer`` wiring key divides by the
    selected tokens (``selected``) or by every real token (``all``, exact for every mode but
    ``seq_mean_token_mean``, which validation refuses). Metrics: ``train/pg_loss``, the loss's own,
    ``train/rollout_is_*`` and the filter's selection."""
    pl, token_filter = comp["policy_loss"], comp["token_filter"]
    real = t["mask"]
    selected = token_filter({"entropy": t["entropy"].detach(), "mask": real, "old_logp": t["old_logp"]})
    correction = {"old_logp": t["old_logp"], "sampler_logp": t.get("sampler_logp"), "mask": real}
    weights, is_metrics = comp["rollout_correction"](correction)  # None: no correction
    pg_loss, pg_metrics = pl({**t, "mask": selected}, agg=agg_mode, weights=weights)
    if token_filter.wiring["normalizer"] == "all":
        pg_loss = pg_loss * share(denominator(selected, mode=agg_mode), float(denominator(real, mode=agg_mode)), False)
    metrics = {"train/pg_loss": pg_loss.item()}
    metrics.update({f"train/{k}": float(v) for k, v in pg_metrics.items()})
    metrics.update({f"train/rollout_is_{k}": float(v) for k, v in is_metrics.items()})
    if token_filter.fn is not filters.none:
        selection = filters.selection_metrics(t["entropy"], real, selected)
        metrics.update({f"train/{k}": float(v) for k, v in selection.items()})
    return shares.loss * pg_loss, metrics


def entropy_bonus(comp: dict, t: dict, shares: Shares, agg_mode: str) -> tuple[Tensor, dict[str, float]]:
    """− ``policy_loss.entropy_coef`` · the aggregated entropy of the current policy."""
    coef = comp["policy_loss"].wiring["entropy_coef"]
    return -shares.loss * coef * aggregate(t["entropy"], t["mask"], mode=agg_mode), {}


def kl_penalty(comp: dict, t: dict, shares: Shares, agg_mode: str) -> tuple[Tensor, dict[str, float]]:
    """``kl.coef`` · the aggregated KL estimate to the reference (``kl.placement=loss``)."""
    kl = comp["kl"]
    return shares.loss * kl.wiring["coef"] * aggregate(kl(t), t["mask"], mode=agg_mode), {}


def lm_term(comp: dict, t: dict, shares: Shares, agg_mode: str) -> tuple[Tensor, dict[str, float]]:
    """``lm_loss.coef`` · the LM loss on the positive samples, weighted by their tokens' share."""
    lm = comp["lm_loss"]
    return shares.positive * lm.wiring["coef"] * lm(t), {}


def advantage_weighted_gradient(cfg, comp: dict) -> bool:
    """A policy loss registered ``advantage_weighted`` on every real token: a token filter's pool is the
    micro-batch, and Clip-Cov's and KL-Cov's covariances pool it too."""
    return registry.advantage_weighted("policy_loss", cfg.policy_loss.name) and comp["token_filter"].fn is filters.none


def never(cfg, comp: dict) -> bool:
    return False


def always(cfg, comp: dict) -> bool:
    return True


def has_entropy_bonus(cfg, comp: dict) -> bool:
    return comp["policy_loss"].wiring.get("entropy_coef", 0.0) > 0


def has_kl_in_loss(cfg, comp: dict) -> bool:
    return comp["kl"].wiring["placement"] == "loss" and comp["kl"].wiring["coef"] > 0


def has_lm_loss(cfg, comp: dict) -> bool:
    return comp["lm_loss"].wiring["coef"] > 0


LM_LOSS = "LM loss"  # did positive-example NLL act? its share of the objective (train/nll_share)
TERMS: list[Term] = [
    Term("policy gradient", always, advantage_weighted_gradient, policy_gradient),
    Term("entropy bonus", has_entropy_bonus, never, entropy_bonus),
    Term("KL in the loss", has_kl_in_loss, never, kl_penalty),
    Term(LM_LOSS, has_lm_loss, never, lm_term),
]


def active_terms(cfg, comp: dict) -> list[Term]:
    return [term for term in TERMS if term.on(cfg, comp)]


def micro_objective(cfg, comp: dict, t: dict, shares: Shares, agg_mode: str) -> tuple[Tensor, dict[str, float]]:
    """The policy's objective on one micro-batch, weighted by its ``shares`` of the minibatch's (``t``: its
    ``[b, t]`` tensors by name, the current policy's ``entropy`` among them) -> (the sum of the terms that are on,
    their metrics, ``train/entropy`` and ``train/nll_share``: |the LM loss term| / Σ |terms|, 0 without it)."""
    metrics = {"train/entropy": aggregate(t["entropy"], t["mask"], mode=agg_mode).item()}
    total, sizes = None, {}
    for term in active_terms(cfg, comp):
        value, term_metrics = term.value(comp, t, shares, agg_mode)
        total = value if total is None else total + value
        sizes[term.name] = value.detach().abs()
        metrics.update(term_metrics)
    metrics["train/nll_share"] = 0.0
    if LM_LOSS in sizes:  # one device sync; 0 / 0 (no positive row and a zero objective) counts as 0
        whole = sum(sizes.values()).clamp(min=torch.finfo(sizes[LM_LOSS].dtype).tiny)
        metrics["train/nll_share"] = float(sizes[LM_LOSS] / whole)
    return total, metrics


def forward_only_rows(cfg, comp: dict, advantages: Tensor, mask: Tensor) -> Tensor | None:
    """``[B]`` bool: the rows that may run their forward only, those whose advantages on their real tokens are all
    0 (``advantages``, ``mask``: ``[B, T]``), when every term of the objective spares them -> None where none may:
    ``trainer.skip_zero_advantage`` off, or a term that trains a row whatever its advantage."""
    if not cfg.trainer.skip_zero_advantage:
        return None
    if not all(term.spares_rows_without_advantage(cfg, comp) for term in active_terms(cfg, comp)):
        return None
    return ~((advantages != 0) & (mask > 0)).any(-1)


def share(part, whole: float, padding: bool) -> float:
    """``part`` / ``whole`` of a loss normaliser (0 for a padding micro-batch or an empty whole)."""
    return 0.0 if padding or whole == 0 else float(part) / whole
