"""Online DPO, ``algo=online_dpo`` (``trainer.loop=online_dpo``): TRL's ``OnlineDPOTrainer`` (Guo et al. 2024,
arXiv 2402.04792) with the task's verifier ranking the answers, a training mode beside the RL loop (``loop.py``).

Once per step:

1–2. sample ``rollout.prompts_per_step`` prompts × ``rollout.group_size`` (G ≥ 2) answers from the current policy and
     score them with the task's verifier (``loop.sample_groups``; N processes: each its share, gathered);
3. pairs: the best against the worst answer of each group (``preference.best_worst``: ties go to the first); a group
   whose rewards are all equal makes none and is counted (``train/tied_groups``);
4. ``trainer.epochs`` × ``trainer.minibatches`` DPO updates on the pairs (``preference_update.py``; the reference as
   in every mode), on the sampled tokens themselves; a step with fewer pairs than processes makes no update;
5. log, evaluate (``evaluation.evaluate``); checkpoint (``loop.end_step``).
"""

from __future__ import annotations

import time

import torch
from omegaconf import DictConfig

from components import preference
from rlx_cli.engine import distributed
from rlx_cli.loops import evaluation, loop
from rlx_cli.loops.build import Parts
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.compute import Clock, count_sampled
from rlx_cli.loops.dpo import log_step, start
from rlx_cli.loops.preference_update import dpo_updates
from rlx_cli.loops.signals import StopRequests


def train(cfg: DictConfig, parts: Parts, tracker, progress, stop: StopRequests, state: TrainState) -> dict[str, float]:
    """Run online DPO steps ``state.step + 1`` .. ``cfg.trainer.steps``; returns the final metrics."""
    models, trainer, last, clock = parts.models, cfg.trainer, state.metrics, Clock(state.compute)
    start(cfg, parts, tracker, progress, state, lambda: {**evaluation.evaluate(cfg, parts), **clock.metrics()})

    with progress.task("online DPO", total=trainer.steps - state.step) as advance:
        for step in range(state.step + 1, trainer.steps + 1):
            started = time.perf_counter()
            # 1–2. sample and score groups of answers
            sampled = loop.sample_groups(cfg, parts, step)
            batch, scores, group_index, sampling, _ = distributed.gather_samples(
                *sampled, models.tokenizer.pad_token_id
            )
            count_sampled(state.compute, sampling)
            generated = time.perf_counter()

            # 3. best against worst of each group
            chosen, rejected, tied = preference.best_worst(scores, group_index)

            # 4. DPO updates on those pairs
            metrics = {}
            if len(chosen) >= distributed.size():
                metrics = dpo_updates(cfg, parts, state, step, batch.select(torch.cat([chosen, rejected])))
                parts.policy_schedule.step()  # the warm-up counts updates
            with parts.engine.sampling():
                parts.sampler.sync(models.policy)  # vLLM: the new weights to the engine
            finished = time.perf_counter()

            # 5. log, evaluate; checkpoint
            lengths = batch.response_mask.sum(1)
            metrics.update(
                {
                    "train/reward": scores.mean().item(),
                    "train/response_len": lengths.float().mean().item(),
                    "train/pairs": float(len(chosen)),
                    "train/tied_groups": float(tied),
                    "train/skipped_steps": float(state.skipped),
                    "perf/step_s": finished - started,
                    "perf/generate_s": generated - started,
                    "perf/tokens_per_s": lengths.sum().item() / (finished - started),
                    **sampling,
                    **loop.gpu_memory(models.device),
                    **clock.metrics(),
                }
            )
            log_step(cfg, tracker, progress, state, step, metrics, lambda: evaluation.evaluate(cfg, parts))
            advance(reward=metrics["train/reward"], acc=last["eval/accuracy"])
            loop.end_step(cfg, parts, tracker, stop, state, step)
    return last
