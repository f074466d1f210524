"""Offline DPO, ``algo=dpo`` (``trainer.loop=dpo``): Rafailov et al. 2023 (arXiv 2305.18290) as TRL's ``DPOTrainer``
runs it, a training mode beside the RL loop (``loop.py``) that shares its build, tracking, checkpoints and guard.

0. the pairs: the task's file (``task=pairs``), or, on any other task, pairs sampled once from the initial policy:
   ``preference.pool_prompts`` prompts × ``rollout.group_size`` answers, the best against the worst of each group by
   the task's verifier (groups whose rewards are all equal make none), kept in ``<trainer.output_dir>/pairs.jsonl``
   (logged with the run; a resumed run reads them back). The seed's offline DPO: data from the initial policy.

Then once per step:

1. the step's ``rollout.prompts_per_step`` pairs, epoch after epoch over the pairs (``pairs.pairs_for_step``);
2. ``trainer.epochs`` × ``trainer.minibatches`` DPO updates (``preference_update.py``; the reference as in every
   mode: the adapters off with LoRA, the frozen copy with full fine-tuning);
3. log; evaluate every ``trainer.eval_every`` steps and at the end: the task's verifier on the policy's answers to
   its held-out prompts (``eval/accuracy``, when the task has answers) and the held-out pairs' DPO metrics under the
   policy (``eval/preference_accuracy``, ``eval/preference_margin``, ``eval/preference_loss``; ``task=pairs``);
4. checkpoint (``loop.end_step``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from components import preference
from rlx_cli.config.errors import UserError
from rlx_cli.engine import distributed
from rlx_cli.loops import evaluation, groups, loop
from rlx_cli.loops.build import Parts
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.compute import SAMPLED, SAMPLED_TOKENS, Clock, count_sampled
from rlx_cli.loops.preference_update import dpo_updates, preference_metrics
from rlx_cli.loops.signals import StopRequests
from rlx_cli.sampling.pairs import Pair, pair_rollout, pairs_for_step, read_pairs, write_pairs

SAMPLED_PAIRS = "pairs.jsonl"  # in trainer.output_dir: the pairs sampled from the initial policy


def train(cfg: DictConfig, parts: Parts, tracker, progress, stop: StopRequests, state: TrainState) -> dict[str, float]:
    """Run DPO steps ``state.step + 1`` .. ``cfg.trainer.steps``; returns the final metrics."""
    models, trainer, last, clock = parts.models, cfg.trainer, state.metrics, Clock(state.compute)
    # 0. the pairs, and the starting point
    train_pairs, eval_pairs = the_pairs(cfg, parts, tracker, progress, state)
    start(cfg, parts, tracker, progress, state, lambda: {**evaluate(cfg, parts, eval_pairs), **clock.metrics()})

    with progress.task("DPO", total=trainer.steps - state.step) as advance:
        for step in range(state.step + 1, trainer.steps + 1):
            started = time.perf_counter()
            # 1. the step's pairs
            chosen = pairs_for_step(train_pairs, cfg.rollout.prompts_per_step, seed=cfg.seed, step=step)
            batch = pair_rollout(parts.sampler, chosen).to(models.device)

            # 2. DPO updates
            metrics = dpo_updates(cfg, parts, state, step, batch)
            parts.policy_schedule.step()
            with parts.engine.sampling():
                parts.sampler.sync(models.policy)  # vLLM: the new weights to the engine, for evaluation

            # 3. log, evaluate
            metrics.update(
                {
                    "train/pairs": float(len(chosen)),
                    "train/response_len": batch.response_mask.sum(1).float().mean().item(),  # chosen and rejected
                    "train/skipped_steps": float(state.skipped),
                    "perf/step_s": time.perf_counter() - started,
                    **loop.gpu_memory(models.device),
                    **clock.metrics(),
                }
            )
            log_step(cfg, tracker, progress, state, step, metrics, lambda: evaluate(cfg, parts, eval_pairs))
            advance(loss=metrics["train/loss"], acc=last.get("eval/accuracy", last.get("eval/preference_accuracy")))

            # 4. checkpoint
            loop.end_step(cfg, parts, tracker, stop, state, step)
    return last


def start(cfg, parts: Parts, tracker, progress, state: TrainState, evaluation) -> None:
    """Before the first step of a mode that samples or evaluates: the sampler on the policy's weights (a resumed
    run's too), and on a fresh run the step-0 evaluation."""
    with parts.engine.sampling():
        parts.sampler.sync(parts.models.policy)
    if state.step == 0:
        state.metrics.update(evaluation())
        tracker.log_metrics(state.metrics, step=0)
        progress.note(f"step 0: {loop.summary(state.metrics)}")


def log_step(cfg, tracker, progress, state: TrainState, step: int, metrics: dict, evaluation) -> None:
    """Evaluate when due (every ``trainer.eval_every`` steps and at the end), log ``metrics``, keep them as the
    latest."""
    trainer = cfg.trainer
    if trainer.eval_every and step % trainer.eval_every == 0 or step == trainer.steps:
        metrics.update(evaluation())
        progress.note(f"step {step}: {loop.summary(metrics)}")
    tracker.log_metrics(metrics, step=step)
    state.metrics.update(metrics)


def evaluate(cfg, parts: Parts, eval_pairs: list[Pair]) -> dict[str, float]:
    """The task's verifier on the policy's answers to the held-out prompts, when the task has them (``eval/accuracy``,
    ``evaluation.evaluate``), and the DPO metrics of the held-out pairs (``eval/preference_*``), when there are any."""
    out = evaluation.evaluate(cfg, parts) if parts.task.eval_problems else {}
    if len(eval_pairs) >= distributed.size():  # N processes: each its block of the pairs
        batch = pair_rollout(parts.sampler, distributed.shard(eval_pairs)).to(parts.models.device)
        held_out = preference_metrics(parts, batch)
        out["eval/preference_accuracy"] = held_out["rewards/accuracy"]
        out["eval/preference_margin"] = held_out["rewards/margins"]
        out["eval/preference_loss"] = held_out["loss"]
    return out


def the_pairs(cfg, parts: Parts, tracker, progress, state: TrainState) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs): the file's (``task=pairs``), or those sampled from the initial policy (no
    held-out pairs: the task's verifier evaluates), sampled on a fresh run (step 0; counted in ``state.compute``)
    and read back on a resumed one."""
    task, fresh = parts.task, state.step == 0
    if getattr(task, "pairs", None) is not None:
        return task.pairs, task.eval_pairs
    path = Path(cfg.trainer.output_dir) / SAMPLED_PAIRS
    if not fresh:
        if not path.is_file():
            raise UserError(f"trainer.resume=true: {path}, the pairs this run sampled at its start, is missing")
        return read_pairs(path), []
    n, size = parts.components["preference"].wiring["pool_prompts"], cfg.rollout.group_size
    progress.note(f"sampling the pairs: {n} prompts x {size} answers from the initial policy")
    pairs = sample_pairs(cfg, parts, n, state.compute)
    if not pairs:
        raise UserError(
            f"no pairs: the answers to each of the preference.pool_prompts={n} prompts all scored alike "
            "(valid: more prompts, or a larger rollout.group_size)"
        )
    if distributed.is_main():
        write_pairs(path, pairs)
        tracker.log_artifact(path)
    return pairs, []


def sample_pairs(cfg, parts: Parts, prompts: int, counts: dict) -> list[Pair]:
    """Pairs from ``prompts`` prompts x ``rollout.group_size`` answers of the current policy: best against worst of
    each group by the task's verifier (``preference.best_worst``); the answers are added to ``counts`` (the run's
    compute). N processes: each samples its block, all get all."""
    task, size = parts.task, cfg.rollout.group_size
    problems = [p for p in distributed.shard(task.train_problems(prompts, seed=cfg.seed, step=0)) for _ in range(size)]
    batch = groups.answers(cfg, parts, problems, cfg.rollout.temperature)
    drawn = {SAMPLED: len(batch.texts), SAMPLED_TOKENS: batch.tokens()}
    count_sampled(counts, {k: distributed.total(v) for k, v in drawn.items()})
    scores = torch.tensor(task.score_batch(batch.texts, problems))
    chosen, rejected, _ = preference.best_worst(scores, torch.arange(len(problems)) // size)
    own = [
        Pair(problems[c].prompt, batch.texts[c], batch.texts[r], problems[c].answer)
        for c, r in zip(chosen.tolist(), rejected.tolist())
    ]
    fields = ("prompt", "chosen", "rejected", "answer")
    columns = [distributed.gather_texts([getattr(p, name) for p in own]) for name in fields]  # [field][rank][pair]
    return [Pair(*row) for ranks in zip(*columns) for row in zip(*ranks)]
