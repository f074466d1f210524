"""Steps 4–5 of a run: value pretraining, then the RL loop. Reads top to bottom, like DESIGN.md's flow."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
from omegaconf import DictConfig

from components import acted
from components import advantage as adv_lib
from components.kl import estimate as kl_estimate
from components.loss_agg import row_weights
from components.masked import last_real, masked_mean
from rlx_cli.engine import distributed
from rlx_cli.engine.batch import Rollout
from rlx_cli.loops import checkpoint
from rlx_cli.loops.build import Parts
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.compute import Clock, count_sampled, count_trained
from rlx_cli.loops.evaluation import evaluate
from rlx_cli.loops.groups import sample_groups
from rlx_cli.loops.guard import count_update
from rlx_cli.loops.overlap import SamplerProcess
from rlx_cli.loops.signals import StopRequests
from rlx_cli.loops.update import UpdateBatch, update_step, value_update
from rlx_cli.sampling import credit


def train(cfg: DictConfig, parts: Parts, tracker, progress, stop: StopRequests, state: TrainState) -> dict[str, float]:
    """Run RL steps ``state.step + 1`` .. ``cfg.trainer.steps``; returns the final metrics.

    A fresh ``state`` (step 0) first pretrains the critic and evaluates; a resumed one goes on from its step.
    Called inside ``stop.deferred()``: a signal ends the step under way, writes a checkpoint and raises ``Stopped``.
    With ``rollout.overlap`` the sampler process starts first, while step 0 evaluates, and stops however the run ends.
    """
    with parts.engine.sampling():  # an engine of its own (vLLM) starts from the policy's weights, a resumed run's too
        parts.sampler.sync(parts.models.policy)
    with SamplerProcess(cfg, parts) if cfg.rollout.overlap else nullcontext() as sampler_process:
        return rl_steps(cfg, parts, tracker, progress, stop, state, sampler_process)


def rl_steps(
    cfg, parts: Parts, tracker, progress, stop: StopRequests, state: TrainState, sampler_process: SamplerProcess | None
) -> dict[str, float]:
    """``train``'s steps; ``sampler_process`` samples them under ``rollout.overlap`` (None: this process does)."""
    models, comp, engine = parts.models, parts.components, parts.engine
    policy, critic = models.policy, models.critic
    rollout_cfg, trainer = cfg.rollout, cfg.trainer
    kl, last = comp["kl"], state.metrics
    clock = Clock(state.compute)  # perf/samples, perf/tokens, perf/train_tokens, perf/wall_s

    if state.step == 0:
        vp = cfg.value_pretrain
        if critic is not None and cfg.critic.init == "reward_model":
            fit = replace(REWARD_FIT, unfinished=cfg.critic.unfinished_score)
            pretrain_value(cfg, parts, tracker, progress, stop, state, fit, cfg.critic.reward_fit_steps)
        if critic is not None and vp.steps > 0:
            pretrain_value(cfg, parts, tracker, progress, stop, state, VALUE_PRETRAIN, vp.steps, vp.stop_explained_var)
        last.update({**evaluate(cfg, parts), **clock.metrics()})
        tracker.log_metrics(last, step=0)
        progress.note(f"step 0: {summary(last)}")

    with progress.task("RL", total=trainer.steps - state.step) as advance:
        for step in range(state.step + 1, trainer.steps + 1):
            started = time.perf_counter()
            # 1–2. sample prompts_per_step prompts x group_size responses and score them
            #      (N processes: each its share of the prompts, gathered into the whole batch; `own` its rows);
            #      rollout.overlap: sampled in the sampler process while the last step updated (loops/overlap.py)
            if sampler_process is None:
                behaviour = parts.behaviour.refresh(policy) if parts.behaviour else policy  # rollout.lag, .dtype
                sampled = sample_groups(cfg, parts, step, behaviour, carried(cfg, state))
            else:
                sampled = sampler_process.take(step, policy, state)  # its perf/generate_s: its sampling time
            batch, scores, group_index, sampling, own = distributed.gather_samples(
                *sampled, models.tokenizer.pad_token_id
            )
            mask = batch.response_mask
            count_sampled(state.compute, sampling)
            generated = time.perf_counter()
            shaping = comp["reward_shaping"]
            shaped, state.shaping = shaping(
                {"scores": scores, "state": state.shaping, "lengths": mask.sum(1)}, max_len=rollout_cfg.max_new_tokens
            )

            # 3. old and reference log-probs, values, over micro-batches of this process's rows. One update on the
            #    whole batch sees the policy that sampled it: its own log-probs, detached, are the old ones (as TRL
            #    does), and a forward is saved; trainer.old_logp=sampler: the sampler's own, no forward (verl's
            #    bypass mode). KL outside the objective: the reference forward only every kl.measure_every steps.
            temperature, bypass = rollout_cfg.temperature, trainer.old_logp == "sampler"
            if bypass:
                old_logp = own.sampler_logp
                if old_logp is None:  # the update would measure its own instead: not what was asked for
                    raise RuntimeError("trainer.old_logp=sampler, but the sampler returned no log-probs of its tokens")
            else:
                old_logp = None if reuses_update_logp(cfg, kl) else engine.logp(own, temperature)
            ref_logp = engine.logp(own, temperature, reference=True) if measures_kl(kl, step, trainer.steps) else None
            values = engine.values(own) if critic is not None else None
            old_logp, ref_logp, values = (distributed.gather(x) for x in (old_logp, ref_logp, values))
            forwarded = synchronized(models.device)

            # 4. token rewards: the score at the last token, minus β·KL per token when KL sits in the reward
            in_reward = kl_in_reward(kl)
            kl_penalty = kl.wiring["coef"] * kl({"logp": old_logp, "ref_logp": ref_logp}) if in_reward else None
            token_rewards = adv_lib.token_rewards(shaped, mask, kl_penalty)

            # 5. one λ per row for the advantages, and the critic's λ for its targets
            lengths = mask.sum(1)
            policy_lam = comp["lam_schedule"]({"lengths": lengths})
            critic_lam = comp["lam_schedule"].wiring.get("critic_lam")

            # 6. advantages (and value targets); a rollout stage's annotations by name (step rewards, SPO's values)
            tensors = {
                "token_rewards": token_rewards,
                "values": values,
                "mask": mask,
                "scores": shaped,
                "group_index": group_index,
                **batch.annotations,
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

            # 7. minibatch epochs: policy loss (+ KL in loss, entropy bonus, LM loss); value loss. DAPO's overlong
            #    filtering takes answers cut at the budget out of the loss. An update with a non-finite loss or
            #    gradient is skipped and counted.
            positive = scores > 0
            truncated = cut_short(batch, models.tokenizer.eos_token_id, rollout_cfg.max_new_tokens)
            learned = batch.without_rows(truncated) if shaping.wiring["overlong_filter"] else batch
            inputs = UpdateBatch(learned, advantages, positive, old_logp, ref_logp, values, returns, group_index)
            update, seen_logp = update_step(cfg, parts, state, step, inputs)
            if old_logp is None:  # the update's own forward measured them
                old_logp = distributed.sum_rows(seen_logp)
            sampler_logp = None if bypass else batch.sampler_logp  # bypass: the old log-probs are the sampler's
            update.update(logp_metrics(old_logp, ref_logp, sampler_logp, learned.response_mask))
            parts.policy_schedule.step()
            updated = synchronized(models.device)
            with engine.sampling():
                parts.sampler.sync(policy)  # vLLM: the new weights to the engine
            finished = time.perf_counter()

            # 8. log, evaluate
            metrics = {
                "train/reward": scores.mean().item(),
                "train/response_len": lengths.float().mean().item(),
                "train/truncated_frac": truncated.float().mean().item(),
                "train/adv_first_tokens": adv_first_tokens,
                "train/policy_lam": policy_lam.float().mean().item(),
                "train/skipped_steps": float(state.skipped),
                "train/skipped_consecutive": float(state.skipped_in_a_row),
                "perf/step_s": finished - started,
                # steps 1–2: sampling, or with rollout.overlap the wait for the sampler process (its time: sampling)
                "perf/sample_wait_s" if sampler_process else "perf/generate_s": generated - started,
                "perf/logprobs_s": forwarded - generated,  # old and reference log-probs, values
                "perf/update_s": updated - forwarded,  # advantages, then the minibatch epochs
                "perf/sync_s": finished - updated,
                "perf/seq_tokens": float(batch.attention_mask.sum()),  # prompt and response tokens of the batch
                "perf/tokens_per_s": lengths.sum().item() / (finished - started),
                **acted_metrics(comp, tensors, policy_lam),
                **credit.step_metrics(batch),
                **sampling,
                **update,
                **gpu_memory(models.device),
                **clock.metrics(),
            }
            log_step(cfg, parts, tracker, progress, step, metrics, last)
            advance(reward=metrics["train/reward"], acc=last["eval/accuracy"])

            # 9. checkpoint every ckpt_every steps, at the end, and when a signal asks the run to stop
            end_step(cfg, parts, tracker, stop, state, step)
    return last


def log_step(cfg, parts: Parts, tracker, progress, step: int, metrics: dict[str, float], last: dict) -> None:
    """Evaluate every ``trainer.eval_every`` steps and at the last; log ``metrics`` at ``step``; keep them in
    ``last``."""
    trainer = cfg.trainer
    if trainer.eval_every and step % trainer.eval_every == 0 or step == trainer.steps:
        metrics.update(evaluate(cfg, parts))
        progress.note(f"step {step}: {summary(metrics)}")
    tracker.log_metrics(metrics, step=step)
    last.update(metrics)


def end_step(cfg, parts: Parts, tracker, stop: StopRequests, state: TrainState, step: int) -> None:
    """Step ``step`` is done: checkpoint every ``trainer.ckpt_every`` steps, at the last, and when a signal asks the
    run to stop (then raise ``Stopped``)."""
    trainer = cfg.trainer
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


def acted_metrics(comp: dict, t: dict, policy_lam) -> dict[str, float]:
    """Did VAPO's ingredients act on this step (docs/metrics.md, "Did it act")? From step 6's tensors ``t``
    (``token_rewards``, ``values`` (None without a critic), ``mask`` [B, T], ``scores``, ``group_index`` [B]) and
    the per-row λ: ``train/policy_lam_min``/``_max``, ``train/groups_with_positive``, ``train/long_quarter_weight``
    (the loss weight of the longest quarter under ``loss_agg``) and, with a critic, ``train/critic_first_token_bias``
    (its value at the first response token, before its update, minus the Monte-Carlo return)."""
    mask, values = t["mask"], t["values"]
    low, high = acted.lam_range(policy_lam)
    weights = row_weights(mask, mode=comp["loss_agg"].hparams["mode"])
    metrics = {
        "train/policy_lam_min": low,
        "train/policy_lam_max": high,
        "train/groups_with_positive": float(acted.groups_with_positive(t["scores"], t["group_index"])),
        "train/long_quarter_weight": float(acted.longest_quarter_share(weights, mask.sum(1))),
    }
    if values is not None:
        metrics["train/critic_first_token_bias"] = float(acted.first_token_bias(values, t["token_rewards"], mask))
    return metrics


def kl_in_reward(kl) -> bool:
    return kl.wiring["placement"] == "reward" and kl.wiring["coef"] > 0


def measures_kl(kl, step: int, last_step: int) -> bool:
    """Whether step ``step`` runs the reference forward: every step when KL is in the objective (``kl.coef`` > 0);
    else, when it only feeds the ``train/kl`` metric, every ``kl.measure_every`` steps and the last."""
    every = kl.wiring.get("measure_every", 1)
    return kl.wiring["coef"] > 0 or step % every == 0 or step == last_step


def synchronized(device: torch.device) -> float:
    """``time.perf_counter()`` once the GPU's queued work is done (on the CPU, at once): stage times that add up."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def gpu_memory(device: torch.device) -> dict[str, float]:
    """``perf/gpu_peak_gib``: the most GPU memory this process has allocated so far (none on the CPU)."""
    if device.type != "cuda":
        return {}
    return {"perf/gpu_peak_gib": torch.cuda.max_memory_allocated(device) / 2**30}


def logp_metrics(old_logp, ref_logp, sampler_logp, mask) -> dict[str, float]:
    """``train/kl`` (k3 estimate to the reference; none on a step without ``ref_logp``) and, when the sampler gave
    its own log-probs (sampled answers), how far it is from the trainer: ``train/rollout_kl`` (mean k3 estimate of
    KL(sampler ‖ trainer) on the sampled tokens), ``train/sampler_logp_gap_max`` and ``train/sampler_logp_gap`` (the
    largest and the mean |sampler log-prob − trainer log-prob|). Tensors ``[B, T]``, over ``mask``'s tokens."""
    metrics = {}
    if ref_logp is not None:
        metrics["train/kl"] = float(masked_mean(kl_estimate(old_logp, ref_logp, kind="k3"), mask))
    if sampler_logp is not None:
        gap = torch.where(mask.bool(), (old_logp - sampler_logp).abs(), 0.0)
        metrics["train/rollout_kl"] = float(masked_mean(kl_estimate(sampler_logp, old_logp, kind="k3"), mask))
        metrics["train/sampler_logp_gap_max"] = float(gap.max()) if gap.numel() else 0.0
        metrics["train/sampler_logp_gap"] = float(masked_mean(gap, mask))
    return metrics


def cut_short(batch: Rollout, eos_id: int, max_new_tokens: int) -> torch.Tensor:
    """[B] bool: answers that reached ``max_new_tokens`` without an EOS (cut at the budget)."""
    lengths = batch.response_mask.sum(1).long()
    last = batch.responses.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return (lengths >= max_new_tokens) & (last != eos_id)


def carried(cfg, state: TrainState):
    """Where a step's surplus of informative groups waits for the next (``rollout.carry_surplus``); None: dropped."""
    return state.carried if cfg.rollout.carry_surplus else None


def reuses_update_logp(cfg, kl) -> bool:
    """One update on the whole batch (1 epoch, 1 minibatch) and no KL in the reward: the policy that sampled the
    batch is the one the update sees, so its log-probs there, detached, are the old ones; no separate forward."""
    return cfg.trainer.epochs == 1 and cfg.trainer.minibatches == 1 and not kl_in_reward(kl)


@dataclass(frozen=True)
class CriticFit:
    """A critic-only stage before RL on the frozen initial policy's answers: its metric prefix, whether the final
    score is the target of every response token or of the last one only, and where its prompts come from."""

    name: str
    final_only: bool
    first_draw: int  # its prompts are those of RL steps -first_draw, -first_draw - 1, ...: unseen by RL and each other
    unfinished: float | None = None  # final_only: every earlier token's target (None: none, their values left free)


# a critic "like a reward model" (critic.init=reward_model): the final score on complete answers, and
# critic.unfinished_score on unfinished ones
REWARD_FIT = CriticFit("reward_fit", final_only=True, first_draw=1_000_001)
# VC-PPO: Monte-Carlo returns (λ = 1, γ = 1), the final score at every response token
VALUE_PRETRAIN = CriticFit("value_pretrain", final_only=False, first_draw=1)


def fit_targets(fit: CriticFit, scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A critic stage's (returns, mask of the tokens that carry one), both ``[B, T]``; ``scores`` ``[B]``.

    Not ``final_only``: the score at every response token (Monte-Carlo returns). ``final_only``: the score at each
    answer's last real token; before it ``fit.unfinished`` (an unfinished answer's score), or no target at all.
    """
    if not fit.final_only:
        return scores[:, None] * mask, mask
    last = last_real(mask)
    if fit.unfinished is None:
        return scores[:, None] * mask * last, mask * last
    return torch.where(last, scores[:, None], fit.unfinished) * mask, mask


def pretrain_value(
    cfg,
    parts: Parts,
    tracker,
    progress,
    stop: StopRequests,
    state: TrainState,
    fit: CriticFit,
    steps: int,
    target: float | None = None,
) -> None:
    """The critic alone fits the frozen initial policy's scores for ``steps`` batches (``fit``: on which tokens),
    logged as ``<name>/*``; it stops early once its explained variance reaches ``target``."""
    agg_mode, words = parts.components["loss_agg"].hparams["mode"], fit.name.replace("_", " ")
    with progress.task(words, total=steps) as advance:
        for step in range(1, steps + 1):
            batch, scores, _, drawn = sample_groups(cfg, parts, -(fit.first_draw + step - 1))
            count_sampled(state.compute, drawn)
            count_trained(state.compute, batch.tokens())
            returns, mask = fit_targets(fit, scores, batch.response_mask)
            old_values = parts.engine.values(batch)
            metrics, stepped = value_update(cfg, parts, batch, old_values, returns, agg_mode, mask)
            count_update(state, stepped, cfg.trainer.max_skipped)
            metrics = {k.replace("train/", f"{fit.name}/"): v for k, v in metrics.items()}
            tracker.log_metrics(metrics, step=step)
            advance(value_loss=metrics[f"{fit.name}/value_loss"], ev=metrics[f"{fit.name}/explained_var"])
            stop.requested = distributed.first_signal(stop.requested)
            if stop.requested:
                raise stop.stop(f"during {words} (step {step}), before the first checkpoint")
            if target is not None and metrics[f"{fit.name}/explained_var"] >= target:
                progress.note(f"{words} stopped at step {step}: explained variance reached the target")
                break


def summary(metrics: dict[str, float]) -> str:
    keys = ("eval/accuracy", "eval/accuracy_sampled", "eval/preference_accuracy", "train/reward")
    return "  ".join(f"{k} {metrics[k]:.3f}" for k in keys if k in metrics)
