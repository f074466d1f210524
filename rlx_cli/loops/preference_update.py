"""DPO updates on a batch of pairs over the engine's micro-batches, exact whatever ``trainer.micro_batch_tokens``.

A batch of P pairs is one ``Rollout`` of 2P rows: the chosen completions in rows 0..P−1, the rejected ones in rows
P..2P−1 (pair p: rows p and P + p). A minibatch's loss, the mean over its pairs of ℓ(Δ_p), couples each pair's two
rows, and the token budget may put them in different micro-batches. So each update runs in two passes:

1. without gradients, micro-batched (``Engine.logp``): the sequence log-probs x ``[2p]`` of the minibatch's rows
   under the policy and the reference, the loss L, and by autograd on x alone g = ∂L/∂x ``[2p]``
   (for the sigmoid loss −β·σ(−β·Δ_p)/P on the chosen row, the opposite on the rejected one);
2. with gradients, micro-batch by micro-batch: the backward of Σ_rows g·x(θ). By the chain rule its gradient is
   Σ g·∇x = ∇L, so the accumulated gradient is the minibatch's exactly, however its rows are split.

The price is one forward without gradients per update. The two passes see the same x because training runs without
dropout (``models.training_mode``; LoRA's own ``model.lora.dropout``, 0 by default, would make them differ). Sequence
log-probs are at temperature 1, the policy's own distribution, as TRL's DPO trainers take them. With N processes each
holds its slice of each minibatch's pairs; g carries its share of the pairs and the gradients are summed
(``Engine.step_gradients``), as in ``update.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components import preference
from rlx_cli.engine import distributed
from rlx_cli.engine.batch import Rollout
from rlx_cli.loops.build import Parts
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.compute import count_trained
from rlx_cli.loops.guard import count_update, guarded_step, nan_injected


def sequence_logp(parts: Parts, batch: Rollout, *, reference: bool = False) -> Tensor:
    """Sequence log-probs ``[B]`` of ``batch``'s responses under the policy (or the reference), without gradients: sums
    over completion tokens, or means for a length-averaged ``preference.kind`` (IPO)."""
    kind = parts.components["preference"].hparams["kind"]
    return preference.sequence_logp(parts.engine.logp(batch, 1.0, reference=reference), batch.response_mask, kind=kind)


def dpo_updates(cfg, parts: Parts, state: TrainState, step: int, pairs: Rollout) -> dict[str, float]:
    """``trainer.epochs`` passes of ``trainer.minibatches`` DPO updates over the pairs of ``pairs`` (the step's,
    the same on every process) -> the mean of their ``train/*`` metrics. Needs at least one pair per process."""
    count = pairs.responses.shape[0] // 2
    count_trained(state.compute, cfg.trainer.epochs * pairs.tokens())
    totals: dict[str, float] = {}
    updates = 0
    for _ in range(cfg.trainer.epochs):
        for own in distributed.minibatch_rows(count, min(cfg.trainer.minibatches, count)):
            minibatch = pairs.select(torch.cat([own, own + count]).to(pairs.responses.device))
            metrics, stepped = pair_update(cfg, parts, step, minibatch, distributed.total(len(own)))
            count_update(state, stepped, cfg.trainer.max_skipped)
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v
            updates += 1
    return {k: v / updates for k, v in totals.items()}


def pair_update(cfg, parts: Parts, step: int, batch: Rollout, pairs_total: float) -> tuple[dict[str, float], bool]:
    """One optimizer step on this process's pairs of a minibatch of ``pairs_total`` pairs -> (metrics of the whole
    minibatch, whether it stepped)."""
    dpo, engine, models = parts.components["preference"], parts.engine, parts.models
    kind = dpo.hparams["kind"]
    own = batch.responses.shape[0] // 2
    share = own / pairs_total
    ref = sequence_logp(parts, batch, reference=True)
    x = sequence_logp(parts, batch).detach().requires_grad_()
    loss, metrics = dpo(by_name(x, ref))
    (g,) = torch.autograd.grad(loss * share, x)
    parts.policy_optimizer.zero_grad(set_to_none=True)
    for mb in engine.micro_batches(batch):
        logp, _ = models.scorer(mb.batch, 1.0)
        rows = preference.sequence_logp(logp, mb.batch.response_mask, kind=kind)
        weights = torch.zeros_like(rows) if mb.padding else g[mb.rows].to(rows.dtype)
        objective = (weights * rows).sum()
        if nan_injected(step):
            objective = objective * math.nan
        engine.backward(objective)
    params = [p for group in parts.policy_optimizer.param_groups for p in group["params"]]
    grad_norm = engine.step_gradients(parts.policy_optimizer, params, cfg.trainer.grad_clip)
    stepped = guarded_step(parts.policy_optimizer, torch.tensor(distributed.total(loss.item() * share)), grad_norm)
    weighted = {"train/loss": loss.item(), **{f"train/{k}": float(v) for k, v in metrics.items()}}
    weighted = {k: v * share for k, v in weighted.items()}
    return distributed.combine({**weighted, "train/grad_norm": float(grad_norm) / distributed.size()}), stepped


def by_name(x: Tensor, ref: Tensor) -> dict[str, Tensor]:
    """The policy's and the reference's sequence log-probs of a pair batch, ``[2p]`` each -> ``preference.dpo``'s
    inputs by name, ``[p]`` each."""
    own = x.shape[0] // 2
    return {
        "chosen_logp": x[:own],
        "rejected_logp": x[own:],
        "ref_chosen_logp": ref[:own],
        "ref_rejected_logp": ref[own:],
    }


@torch.no_grad()
def preference_metrics(parts: Parts, pairs: Rollout) -> dict[str, float]:
    """The DPO loss and metrics of ``pairs`` (this process's, weighted into the whole set's) under the policy and the
    reference, without an update -> ``loss``, ``rewards/accuracy``, ``rewards/margins``, ..."""
    own = pairs.responses.shape[0] // 2
    share = own / distributed.total(own)
    x, ref = sequence_logp(parts, pairs), sequence_logp(parts, pairs, reference=True)
    loss, metrics = parts.components["preference"](by_name(x, ref))
    return distributed.combine({k: float(v) * share for k, v in {"loss": loss, **metrics}.items()})
