"""Steps 4–5 of a run: value pretraining, then the RL loop. Reads top to bottom, like DESIGN.md's flow."""

from __future__ import annotations

import math
import time

import torch
from omegaconf import DictConfig

from components import advantage as adv_lib
from components.kl import estimate as kl_estimate
from components.lm_loss import positive_token_count
from components.loss_agg import aggregate, denominator
from components.masked import masked_mean
from rlx_cli import checkpoint, distributed
from rlx_cli.build import Parts
from rlx_cli.checkpoint import TrainState
from rlx_cli.guard import count_update, guarded_step, nan_injected
from rlx_cli.models import evaluating, response_logp
from rlx_cli.rollout import Rollout
from rlx_cli.signals import StopRequests


def train(cfg: DictConfig, parts: Parts, tracker, progress, stop: StopRequests, state: TrainState) -> dict[str, float]:
    """Run RL steps ``state.step + 1`` .. ``cfg.trainer.steps``; returns the final metrics.

    A fresh ``state`` (step 0) first pretrains the critic and evaluates; a resumed one goes on from its step.
    Called inside ``stop.deferred()``: a signal ends the step under way, writes a checkpoint and raises ``Stopped``.
    """
    models, comp = parts.models, parts.components
    policy, critic = models.policy, models.critic
    rollout_cfg, trainer = cfg.rollout, cfg.trainer
    agg_mode = comp["loss_agg"].hparams["mode"]
    kl, last = comp["kl"], state.metrics

    parts.sampler.sync(policy)  # an engine of its own (vLLM) starts from the policy's weights, a resumed run's too
    if state.step == 0:
        if critic is not None and cfg.value_pretrain.steps > 0:
            pretrain_value(cfg, parts, tracker, progress, stop, state)
        last.update(evaluate(cfg, parts))
        tracker.log_metrics(last, step=0)
        progress.note(f"step 0: {summary(last)}")

    with progress.task("RL", total=trainer.steps - state.step) as advance:
        for step in range(state.step + 1, trainer.steps + 1):
            started = time.perf_counter()
            # 1–2. sample prompts_per_step prompts x group_size responses and score them
            #      (N processes: each its share of the prompts, gathered into the whole batch; `own` its rows)
            sampled = sample_groups(cfg, parts, step)
            batch, scores, group_index, sampling, own = distributed.gather_samples(
                *sampled, models.tokenizer.pad_token_id
            )
            mask = batch.response_mask
            generated = time.perf_counter()
            shaped, state.shaping = comp["reward_shaping"]({"scores": scores, "state": state.shaping})

            # 3. old and reference log-probs, values. One update on the whole batch sees the policy that sampled
            #    it: its own log-probs, detached, are the old ones (as TRL does), and a forward is saved.
            #    KL outside the objective: the reference forward only every kl.measure_every steps, for train/kl.
            with torch.no_grad(), evaluating(policy):
                old_logp = (
                    None if reuses_update_logp(cfg, kl) else response_logp(policy, own, rollout_cfg.temperature)[0]
                )
                ref_logp = None
                if measures_kl(kl, step, trainer.steps):
                    with models.reference_context():
                        ref_logp, _ = response_logp(models.reference_model, own, rollout_cfg.temperature)
                values = critic(own) if critic is not None else None
            old_logp, ref_logp, values = (distributed.gather(x) for x in (old_logp, ref_logp, values))

            # 4. token rewards: the score at the last token, minus β·KL per token when KL sits in the reward
            in_reward = kl_in_reward(kl)
            kl_penalty = kl.wiring["coef"] * kl({"logp": old_logp, "ref_logp": ref_logp}) if in_reward else None
            token_rewards = adv_lib.token_rewards(shaped, mask, kl_penalty)

            # 5. one λ per row for the advantages, and the critic's λ for its targets
            lengths = mask.sum(1)
            policy_lam = comp["lam_schedule"]({"lengths": lengths})
            critic_lam = comp["lam_schedule"].wiring.get("critic_lam")

            # 6. advantages (and value targets)
            tensors = {
                "token_rewards": token_rewards,
                "values": values,
                "mask": mask,
                "scores": shaped,
                "group_index": group_index,
            }
            advantages = comp["advantage"](tensors, lam=policy_lam)
            returns = None
            if isinstance(advantages, tuple):
                advantages, returns = advantages
            if values is not None and critic_lam is not None:
                gamma = comp["advantage"].hparams.get("gamma", 1.0)
                _, returns = adv_lib.gae(token_rewards, values, mask, gamma=gamma, lam=critic_lam)
            adv_first_tokens = float(masked_mean(advantages[:, :3], mask[:, :3]))  # raw: VC-PPO's bias shows here
            advantages = adv_lib.whiten_and_clip(advantages, mask, **comp["advantage"].wiring)

            # 7. minibatch epochs: policy loss (+ KL in loss, entropy bonus, LM loss); value loss.
            #    An update with a non-finite loss or gradient is skipped and counted.
            positive = scores > 0
            update = update_step(
                cfg, parts, state, step, batch, old_logp, ref_logp, advantages, positive, values, returns, agg_mode
            )
            if old_logp is not None:  # else update_step measured them on its own forward
                update.update(logp_metrics(old_logp, ref_logp, batch.sampler_logp, mask))
            parts.policy_schedule.step()
            updated = time.perf_counter()
            parts.sampler.sync(policy)  # vLLM: the new weights to the engine
            finished = time.perf_counter()

            # 8. log, evaluate
            metrics = {
                "train/reward": scores.mean().item(),
                "train/response_len": lengths.float().mean().item(),
                "train/adv_first_tokens": adv_first_tokens,
                "train/policy_lam": policy_lam.float().mean().item(),
                "train/skipped_steps": float(state.skipped),
                "train/skipped_consecutive": float(state.skipped_in_a_row),
                "perf/step_s": finished - started,
                "perf/generate_s": generated - started,
                "perf/sync_s": finished - updated,
                "perf/tokens_per_s": lengths.sum().item() / (finished - started),
                **sampling,
                **update,
                **gpu_memory(models.device),
            }
            if trainer.eval_every and step % trainer.eval_every == 0 or step == trainer.steps:
                metrics.update(evaluate(cfg, parts))
                progress.note(f"step {step}: {summary(metrics)}")
            tracker.log_metrics(metrics, step=step)
            last.update(metrics)
            advance(reward=metrics["train/reward"], acc=last["eval/accuracy"])

            # 9. checkpoint every ckpt_every steps, at the end, and when a signal asks the run to stop
            state.step = step
            stop.requested = distributed.first_signal(stop.requested)  # every process stops after the same step
            due = trainer.ckpt_every and (step % trainer.ckpt_every == 0 or step == trainer.steps)
            if due or stop.requested:
                tracker.flush()  # the metrics of every step up to a checkpoint are stored before it exists
                saved = checkpoint.save(trainer.output_dir, parts, state, trainer.keep_ckpts)
            if stop.requested:
                raise stop.stop(
                    f"checkpoint {saved} after step {step}; go on with trainer.resume=true "
                    f"trainer.output_dir={trainer.output_dir}"
                )
    return last


def kl_in_reward(kl) -> bool:
    return kl.wiring["placement"] == "reward" and kl.wiring["coef"] > 0


def measures_kl(kl, step: int, last_step: int) -> bool:
    """Whether step ``step`` runs the reference forward: every step when KL is in the objective (``kl.coef`` > 0);
    else, when it only feeds the ``train/kl`` metric, every ``kl.measure_every`` steps and the last."""
    every = kl.wiring.get("measure_every", 1)
    return kl.wiring["coef"] > 0 or step % every == 0 or step == last_step


def gpu_memory(device: torch.device) -> dict[str, float]:
    """``perf/gpu_peak_gib``: the most GPU memory this process has allocated so far (none on the CPU)."""
    if device.type != "cuda":
        return {}
    return {"perf/gpu_peak_gib": torch.cuda.max_memory_allocated(device) / 2**30}


def logp_metrics(old_logp, ref_logp, sampler_logp, mask) -> dict[str, float]:
    """``train/kl`` (k3 estimate to the reference; none on a step without ``ref_logp``) and, when the sampler is
    an engine of its own (vLLM), ``rollout/logp_gap``: mean |sampler log-prob − trainer log-prob| over response
    tokens. Tensors ``[B, T]``."""
    metrics = {}
    if ref_logp is not None:
        metrics["train/kl"] = float(masked_mean(kl_estimate(old_logp, ref_logp, kind="k3"), mask))
    if sampler_logp is not None:
        metrics["rollout/logp_gap"] = float(masked_mean((old_logp - sampler_logp).abs(), mask))
    return metrics


def reuses_update_logp(cfg, kl) -> bool:
    """One update on the whole batch (1 epoch, 1 minibatch) and no KL in the reward: the policy that sampled the
    batch is the one the update sees, so its log-probs there, detached, are the old ones; no separate forward."""
    return cfg.trainer.epochs == 1 and cfg.trainer.minibatches == 1 and not kl_in_reward(kl)


def sample_groups(cfg, parts: Parts, step: int):
    """Sample and score ``prompts_per_step`` groups of ``group_size`` -> (batch, scores [B], group_index [B], metrics).

    With N processes, this process's block of the step's prompts (``distributed.gather_samples`` joins them).

    With ``rollout.dynamic_sampling`` (DAPO, arXiv 2503.14476) groups whose scores are all equal carry no
    signal for a group baseline: they are dropped and more prompts are drawn, up to ``rollout.max_draws`` batches.
    """
    rollout, task = cfg.rollout, parts.task
    size = rollout.group_size
    wanted = len(distributed.shard(range(rollout.prompts_per_step)))  # N processes: each its block of the prompts
    kept_batches, kept_scores, groups, draws = [], [], 0, 0
    while groups < wanted and draws < (rollout.max_draws if rollout.dynamic_sampling else 1):
        problems = task.train_problems(rollout.prompts_per_step, seed=cfg.seed, step=step, draw=draws)
        problems = [p for p in distributed.shard(problems) for _ in range(size)]
        batch = parts.sampler.generate(
            parts.models.policy,
            [p.prompt for p in problems],
            temperature=rollout.temperature,
            max_new_tokens=rollout.max_new_tokens,
        )
        scores = torch.tensor(task.score_batch(batch.texts, problems))
        draws += 1
        keep = torch.ones(wanted, dtype=torch.bool)
        if rollout.dynamic_sampling:
            by_group = scores.view(wanted, size)
            keep = (by_group != by_group[:, :1]).any(1)
            keep &= keep.cumsum(0) <= wanted - groups  # no more groups than still needed
        if keep.any() or (draws == rollout.max_draws and not kept_batches):
            keep = keep if keep.any() else torch.ones(wanted, dtype=torch.bool)
            rows = keep.repeat_interleave(size).nonzero().squeeze(1)
            kept_batches.append(batch.select(rows))
            kept_scores.append(scores[rows])
            groups += int(keep.sum())
    batch = kept_batches[0]
    if len(kept_batches) > 1:
        batch = Rollout.concat(kept_batches, parts.models.tokenizer.pad_token_id)
    group_index = torch.arange(groups).repeat_interleave(size)
    device = parts.models.device
    return (
        batch.to(device),
        torch.cat(kept_scores).to(device),
        group_index.to(device),
        {
            "train/groups": float(groups),
            "train/draws": float(draws),
            "train/reward_errors": float(task.reward_errors),  # cumulative verifier exceptions and time-outs
        },
    )


def update_step(
    cfg,
    parts: Parts,
    state: TrainState,
    step: int,
    batch: Rollout,
    old_logp,
    ref_logp,
    advantages,
    positive,
    old_values,
    returns,
    agg_mode: str,
) -> dict[str, float]:
    """``trainer.epochs`` passes of ``trainer.minibatches`` updates; -> mean train/* metrics.

    An update whose loss or gradient norm is NaN/inf is skipped (``guarded_step``) and counted (``count_update``).
    With N processes each takes its slice of every minibatch and weights its loss by its ``share`` of the
    minibatch's normaliser; summed gradients are the one-process gradient (``rlx_cli/distributed.py``).
    ``old_logp`` None: a single update on the whole batch, whose own detached log-probs are the old ones; it then
    also gives ``logp_metrics`` (``train/kl``, ``rollout/logp_gap``), which the caller does otherwise.
    """
    comp, policy, critic = parts.components, parts.models.policy, parts.models.critic
    kl, lm, pl = comp["kl"], comp["lm_loss"], comp["policy_loss"]
    kl_in_loss = kl.wiring["placement"] == "loss" and kl.wiring["coef"] > 0
    totals: dict[str, float] = {}
    count = 0
    for _ in range(cfg.trainer.epochs):
        for rows in distributed.minibatch_rows(batch.responses.shape[0], cfg.trainer.minibatches):
            mb, mask = batch.select(rows), batch.response_mask[rows]
            share = distributed.share(denominator(mask, mode=agg_mode))
            logp, entropy = response_logp(policy, mb, cfg.rollout.temperature, with_entropy=True)
            tensors = {
                "logp": logp,
                "old_logp": logp.detach() if old_logp is None else old_logp[rows],
                "advantages": advantages[rows],
                "mask": mask,
                "ref_logp": None if ref_logp is None else ref_logp[rows],
                "positive": positive[rows],
            }
            pg_loss, pg_metrics = pl(tensors, agg=agg_mode)
            entropy_mean = aggregate(entropy, mask, mode=agg_mode)
            loss = pg_loss - pl.wiring.get("entropy_coef", 0.0) * entropy_mean
            if kl_in_loss:
                loss = loss + kl.wiring["coef"] * aggregate(kl(tensors), mask, mode=agg_mode)
            objective = share * loss  # this process's part of the minibatch's loss
            if lm.wiring["coef"] > 0:
                lm_term = lm.wiring["coef"] * lm(tensors)
                loss = loss + lm_term
                objective = objective + distributed.share(positive_token_count(mask, positive[rows])) * lm_term
            if nan_injected(step):
                loss, objective = loss * math.nan, objective * math.nan
            parts.policy_optimizer.zero_grad(set_to_none=True)
            objective.backward()
            distributed.sum_gradients(parts.policy_optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in policy.parameters() if p.requires_grad], cfg.trainer.grad_clip or float("inf")
            )
            stepped = guarded_step(parts.policy_optimizer, loss, grad_norm)
            step_metrics = {
                "train/pg_loss": pg_loss.item(),
                "train/entropy": entropy_mean.item(),
                "train/grad_norm": grad_norm.item(),
                **{f"train/{k}": float(v) for k, v in pg_metrics.items()},
            }
            if old_logp is None:  # this forward's log-probs are the sampling policy's
                step_metrics.update(logp_metrics(logp.detach(), tensors["ref_logp"], mb.sampler_logp, mask))
            if critic is not None:
                value_metrics, value_stepped = value_update(
                    cfg, parts, mb, old_values[rows], returns[rows], mask, agg_mode, share
                )
                step_metrics.update(value_metrics)
                stepped = stepped and value_stepped
            count_update(state, stepped, cfg.trainer.max_skipped)
            totals["train/loss"] = totals.get("train/loss", 0.0) + objective.item()  # this process's part already
            for k, v in step_metrics.items():
                totals[k] = totals.get(k, 0.0) + share * v
            count += 1
    return distributed.combine({k: v / count for k, v in totals.items()})


def value_update(cfg, parts: Parts, batch: Rollout, old_values, returns, mask, agg_mode: str, share: float):
    """One critic step on the value loss -> (train/value_loss, train/explained_var, ...; whether it stepped).

    ``share``: this process's part of the loss normaliser (1.0 in one process); the metrics are this process's.
    """
    vl = parts.components["value_loss"]
    values = parts.models.critic(batch)
    loss, metrics = vl({"values": values, "old_values": old_values, "returns": returns, "mask": mask}, agg=agg_mode)
    parts.critic_optimizer.zero_grad(set_to_none=True)
    (share * vl.wiring.get("coef", 1.0) * loss).backward()
    distributed.sum_gradients(parts.critic_optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(
        parts.models.critic.trainable_parameters(), cfg.trainer.grad_clip or float("inf")
    )
    stepped = guarded_step(parts.critic_optimizer, loss, grad_norm)
    explained = adv_lib.explained_variance(values.detach(), returns, mask)
    return {
        "train/value_loss": loss.item(),
        "train/explained_var": float(explained),
        **{f"train/value_{k}": float(v) for k, v in metrics.items()},
    }, stepped


def pretrain_value(cfg, parts: Parts, tracker, progress, stop: StopRequests, state: TrainState) -> None:
    """VC-PPO: the critic alone learns Monte-Carlo returns (λ = 1) of the frozen initial policy."""
    vp = cfg.value_pretrain
    agg_mode = parts.components["loss_agg"].hparams["mode"]
    with progress.task("value pretraining", total=vp.steps) as advance:
        for step in range(1, vp.steps + 1):
            batch, scores, _, _ = sample_groups(cfg, parts, -step)  # negative steps: prompts unseen by RL
            mask = batch.response_mask
            with torch.no_grad():
                old_values = parts.models.critic(batch)
            returns = scores[:, None] * mask  # Monte-Carlo return with λ = 1, γ = 1: the final score at every token
            share = distributed.share(denominator(mask, mode=agg_mode))  # N processes: each its own samples
            metrics, stepped = value_update(cfg, parts, batch, old_values, returns, mask, agg_mode, share)
            count_update(state, stepped, cfg.trainer.max_skipped)
            metrics = distributed.combine(
                {k.replace("train/", "value_pretrain/"): share * v for k, v in metrics.items()}
            )
            tracker.log_metrics(metrics, step=step)
            advance(value_loss=metrics["value_pretrain/value_loss"], ev=metrics["value_pretrain/explained_var"])
            stop.requested = distributed.first_signal(stop.requested)
            if stop.requested:
                raise stop.stop(f"during value pretraining (step {step}), before the first checkpoint")
            if vp.stop_explained_var is not None and metrics["value_pretrain/explained_var"] >= vp.stop_explained_var:
                progress.note(f"value pretraining stopped at step {step}: explained variance reached the target")
                break


@torch.no_grad()
def evaluate(cfg, parts: Parts) -> dict[str, float]:
    """Greedy and sampled accuracy on the task's fixed held-out prompts -> eval/*.

    N processes: each evaluates its block of the prompts; the counts are summed.
    """
    task, policy = parts.task, parts.models.policy
    problems, total = distributed.shard(task.eval_problems), len(task.eval_problems)
    out = {}
    devices = torch.random.fork_rng()  # evaluation must not shift the training samples' random stream
    with devices:
        for name, temperature in (("accuracy", 0.0), ("accuracy_sampled", cfg.rollout.temperature)):
            correct, tokens = 0.0, 0.0
            if problems:  # more processes than prompts leave some without
                batch = parts.sampler.generate(
                    policy,
                    [p.prompt for p in problems],
                    temperature=temperature,
                    max_new_tokens=cfg.rollout.max_new_tokens,
                )
                correct, tokens = sum(task.score_batch(batch.texts, problems)), batch.response_mask.sum().item()
            out[f"eval/{name}"] = distributed.total(correct) / total
            if name == "accuracy":
                out["eval/response_len"] = distributed.total(tokens) / total
    return out


def summary(metrics: dict[str, float]) -> str:
    keys = ("eval/accuracy", "eval/accuracy_sampled", "train/reward")
    return "  ".join(f"{k} {metrics[k]:.3f}" for k in keys if k in metrics)
