"""Step 7 of the loop: minibatch epochs of the policy and value losses, each minibatch over micro-batches.

For each minibatch (with N processes, this process's slice of it: ``distributed.minibatch_rows``):

1. its loss normalisers, once, on the untrimmed minibatch of every process: D = Σ ``loss_agg.denominator``, and
   for the LM loss the count of tokens in positive rows;
2. each micro-batch (``Engine.micro_batches``): a forward with gradients, the components on its ``[b, t]`` tensors,
   and a backward of its loss weighted by denominator(micro) / D. The weights of all micro-batches of all processes
   add up to 1, so the accumulated gradient is the minibatch's, exactly, for every ``loss_agg`` mode;
3. the gradients summed over processes and clipped, then one optimizer step; an update whose loss or gradient
   norm is NaN/inf is skipped (``guard.guarded_step``) and counted (``guard.count_update``).

Metrics are the same weighted sums (``*_max`` metrics the largest value), so they are the minibatch's too.

Rows whose advantages are all 0 (a GRPO group whose answers all scored alike) have a gradient of exactly 0 when every
term of the objective spares them (``objective.forward_only_rows``). With ``trainer.skip_zero_advantage`` (the
default) they go to micro-batches of their own that run the forward and the components without gradients, for the
metrics and the log-probs, and no backward. The normalisers stay the whole minibatch's, so the update, its metrics
and the log-probs it hands back are those of the full backward; it costs a forward instead of a forward and a
backward on those rows (``perf/train_tokens`` counts the rows that ran a backward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from components import acted
from components import advantage as adv_lib
from components.lm_loss import positive_token_count
from components.loss_agg import denominator
from rlx_cli.engine import distributed
from rlx_cli.engine.batch import Rollout
from rlx_cli.engine.microbatch import cut, place
from rlx_cli.loops.build import Parts
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.compute import count_trained
from rlx_cli.loops.guard import count_update, guarded_step, nan_injected
from rlx_cli.loops.objective import Shares, forward_only_rows, micro_objective, share


@dataclass(frozen=True)
class UpdateBatch:
    """Step 7's input: B rows and what steps 3–6 computed for them."""

    batch: Rollout  # the rows that learn (DAPO's overlong filter: cut answers keep their place, no token)
    advantages: Tensor  # [B, T]
    positive: Tensor  # [B] bool: the LM loss's rows
    old_logp: Tensor | None = None  # [B, T]; None: one update on the whole batch, its own detached log-probs
    ref_logp: Tensor | None = None  # [B, T]; None on a step without the reference forward
    old_values: Tensor | None = None  # [B, T] the critic's before the update; None without a critic
    returns: Tensor | None = None  # [B, T] the critic's targets
    group_index: Tensor | None = None  # [B] each row's prompt: train/prompts_per_update (None: not logged)


def update_step(
    cfg, parts: Parts, state: TrainState, step: int, inputs: UpdateBatch
) -> tuple[dict[str, float], torch.Tensor | None]:
    """``trainer.epochs`` passes of ``trainer.minibatches`` updates -> (mean train/* metrics, sampled log-probs).

    ``inputs.old_logp`` None: a single update on the whole batch, whose own detached log-probs are the old ones; they
    are returned, ``[B, T]`` with this process's rows filled (``distributed.sum_rows`` completes them), for the
    metrics the caller takes from old log-probs (``loop.logp_metrics``). Otherwise the second value is None.
    """
    batch, old_logp, agg_mode = inputs.batch, inputs.old_logp, parts.components["loss_agg"].hparams["mode"]
    critic = parts.models.critic
    totals: dict[str, float] = {}
    count = 0
    seen = torch.zeros_like(batch.response_mask) if old_logp is None else None
    forward_only = forward_only_rows(cfg, parts.components, inputs.advantages, batch.response_mask)
    trained = batch.tokens() if forward_only is None else float(batch.response_mask[~forward_only].sum())
    count_trained(state.compute, cfg.trainer.epochs * trained)  # every process holds the whole batch
    for _ in range(cfg.trainer.epochs):
        for rows in distributed.minibatch_rows(batch.responses.shape[0], cfg.trainer.minibatches):
            minibatch = batch.select(rows)
            tensors = {
                "old_logp": None if old_logp is None else old_logp[rows],
                "advantages": inputs.advantages[rows],
                "ref_logp": None if inputs.ref_logp is None else inputs.ref_logp[rows],
                "positive": inputs.positive[rows],
            }
            only = None if forward_only is None else forward_only[rows]
            metrics, stepped, logp = policy_update(cfg, parts, step, minibatch, tensors, agg_mode, only)
            if seen is not None:
                seen[rows] = logp
            if critic is not None:
                value_metrics, value_stepped = value_update(
                    cfg, parts, minibatch, inputs.old_values[rows], inputs.returns[rows], agg_mode
                )
                metrics.update(value_metrics)
                stepped = stepped and value_stepped
            count_update(state, stepped, cfg.trainer.max_skipped)
            if inputs.group_index is not None:  # did group sampling act? the prompts this update sees (its rows)
                metrics["train/prompts_per_update"] = acted.distinct_prompts(inputs.group_index, [rows])
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v
            count += 1
    return {k: v / count for k, v in totals.items()}, seen


def policy_update(cfg, parts: Parts, step: int, minibatch: Rollout, tensors: dict, agg_mode: str, forward_only=None):
    """One optimizer step of the policy on ``minibatch`` (this process's rows; ``forward_only`` [b] bool: rows that
    run no backward, ``objective.forward_only_rows``) -> (metrics of the whole minibatch, whether it stepped, this
    process's detached log-probs [b, T])."""
    engine, mask = parts.engine, minibatch.response_mask
    normaliser = distributed.total(float(denominator(mask, mode=agg_mode)))
    positives = distributed.total(float(positive_token_count(mask, tensors["positive"])))
    micro = engine.micro_batches(minibatch, forward_only)
    parts.policy_optimizer.zero_grad(set_to_none=True)
    sums, logps, poisoned = Sums(), [], nan_injected(step)
    for mb in micro:
        with torch.set_grad_enabled(not mb.forward_only):
            logp, entropy = parts.models.scorer(mb.batch, cfg.rollout.temperature, with_entropy=True)
            real = mb.batch.response_mask
            t = {name: cut(x, mb) for name, x in tensors.items()}
            t.update(logp=logp, entropy=entropy, mask=real, sampler_logp=mb.batch.sampler_logp)
            t["old_logp"] = logp.detach() if t["old_logp"] is None else t["old_logp"]
            shares = Shares(
                loss=share(denominator(real, mode=agg_mode), normaliser, mb.padding),
                positive=share(positive_token_count(real, t["positive"]), positives, mb.padding),
            )
            objective, metrics = micro_objective(cfg, parts.components, t, shares, agg_mode)
        if poisoned:
            objective = objective * math.nan
        if not mb.forward_only:
            engine.backward(objective)
        sums.add({"train/loss": objective.item()}, 1.0)
        sums.add(metrics, shares.loss)
        logps.append(logp.detach())
    params = [p for group in parts.policy_optimizer.param_groups for p in group["params"]]
    grad_norm = engine.step_gradients(parts.policy_optimizer, params, cfg.trainer.grad_clip)
    loss = torch.tensor(sums.totals["train/loss"])
    stepped = guarded_step(parts.policy_optimizer, loss, grad_norm)
    metrics = distributed.combine({**sums.totals, "train/grad_norm": float(grad_norm) / distributed.size()})
    return metrics, stepped, place(logps, micro, tuple(mask.shape))


def value_update(cfg, parts: Parts, batch: Rollout, old_values, returns, agg_mode: str, mask=None):
    """One critic step on the value loss over ``batch`` (this process's rows; its normaliser summed over
    processes) -> (train/value_loss, train/explained_var, ... of the whole batch; whether it stepped).

    ``mask`` ``[B, T]``: the tokens that carry a target (default: every response token)."""
    vl, engine, critic = parts.components["value_loss"], parts.engine, parts.models.critic
    mask = batch.response_mask if mask is None else mask
    normaliser = distributed.total(float(denominator(mask, mode=agg_mode)))
    micro = engine.micro_batches(batch)
    parts.critic_optimizer.zero_grad(set_to_none=True)
    sums, all_values, total_loss = Sums(), [], 0.0
    for mb in micro:
        real = mb.batch.response_mask if mb.padding else cut(mask, mb)  # a padding micro-batch has no real token
        with critic.active():  # a LoRA critic's adapter stays on through backward (activation checkpointing)
            values = critic(mb.batch)
            tensors = {"values": values, "old_values": cut(old_values, mb), "returns": cut(returns, mb), "mask": real}
            loss, metrics = vl(tensors, agg=agg_mode)
            weight = share(denominator(real, mode=agg_mode), normaliser, mb.padding)
            engine.backward(weight * vl.wiring.get("coef", 1.0) * loss)
        total_loss += weight * loss.item()
        sums.add({"train/value_loss": loss.item()}, weight)
        sums.add({f"train/value_{k}": float(v) for k, v in metrics.items()}, weight)
        all_values.append(values.detach())
    params = critic.trainable_parameters()
    grad_norm = engine.step_gradients(parts.critic_optimizer, params, cfg.trainer.grad_clip)
    stepped = guarded_step(parts.critic_optimizer, torch.tensor(total_loss), grad_norm)
    values = place(all_values, micro, tuple(mask.shape))
    own_share = share(denominator(mask, mode=agg_mode), normaliser, False)
    explained = float(adv_lib.explained_variance(values, returns, mask))  # this process's rows, weighted below
    sums.add({"train/explained_var": explained}, own_share)
    return distributed.combine(sums.totals), stepped


class Sums:
    """Weighted sums of metrics over micro-batches; ``*_max`` metrics keep their largest value instead."""

    def __init__(self):
        self.totals: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for k, v in metrics.items():
            if k.endswith("_max"):
                self.totals[k] = max(self.totals.get(k, -math.inf), v)
            else:
                self.totals[k] = self.totals.get(k, 0.0) + weight * v
