"""RFT, rejection-sampling fine-tuning (Yuan et al. 2023, arXiv 2308.01825; DeepSeekMath §5.2.1, Table 10):
supervised steps on the initial policy's correct answers, sampled once. ``trainer.loop=rft`` (``algo=rft``).

1. Before step 1: the prompts the RL loop would draw at steps 1..``trainer.steps`` (``loop.sample_groups``:
   ``rollout.prompts_per_step`` prompts x ``rollout.group_size`` answers each, from the initial policy through the
   run's sampler, HF or vLLM), scored; the correct ones (score > 0) are kept, shuffled (``seed``) and saved in
   ``trainer.output_dir/rft_samples/`` (safetensors + JSON), so that a resumed run trains on the same ones. The
   sample budget is that of an RL run with the same settings. Logged at step 0: ``rft/sampled``, ``rft/correct``,
   ``rft/accuracy`` (the initial policy's sampled accuracy on them).
2. Step s: the s-th of ``trainer.steps`` equal slices of the kept answers (``train/samples``, their mean length
   ``train/response_len``), ``trainer.epochs`` x ``trainer.minibatches`` updates of the policy's loss with every
   row positive (``update.update_step``: micro-batched, exact). ``algo=rft`` makes that loss the NLL alone:
   ``policy_loss=none``, ``lm_loss=positive_nll`` at coef 1 (a KL in the loss, ``kl.placement=loss``, adds the
   reference's forward).
3. Log, evaluate, checkpoint as the RL loop (``loop.log_step``, ``loop.end_step``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rlx_cli.config.errors import UserError
from rlx_cli.engine import distributed
from rlx_cli.engine.batch import Rollout
from rlx_cli.loops.build import Parts
from rlx_cli.loops.checkpoint import TrainState
from rlx_cli.loops.compute import Clock, count_sampled
from rlx_cli.loops.evaluation import evaluate
from rlx_cli.loops.loop import end_step, log_step, sample_groups, summary
from rlx_cli.loops.signals import StopRequests
from rlx_cli.loops.update import UpdateBatch, update_step

SAMPLES = "rft_samples"
TENSORS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def train(cfg: DictConfig, parts: Parts, tracker, progress, stop: StopRequests, state: TrainState) -> dict[str, float]:
    """Run RFT steps ``state.step + 1`` .. ``cfg.trainer.steps``; returns the final metrics (as ``loop.train``)."""
    trainer, engine, policy = cfg.trainer, parts.engine, parts.models.policy
    last, clock = state.metrics, Clock(state.compute)
    with engine.sampling():  # vLLM starts from the policy's weights, a resumed run's too
        parts.sampler.sync(policy)
    if state.step == 0:
        samples, drawn = draw_samples(cfg, parts, progress, stop, state.compute)
        last.update({**drawn, **evaluate(cfg, parts), **clock.metrics()})
        tracker.log_metrics(last, step=0)
        progress.note(f"step 0: {summary(last)}")
    else:
        samples = load_samples(cfg)
    slices = torch.arange(len(samples.texts)).tensor_split(trainer.steps)
    with progress.task("RFT", total=trainer.steps - state.step) as advance:
        for step in range(state.step + 1, trainer.steps + 1):
            started = time.perf_counter()
            batch = samples.select(slices[step - 1]).to(parts.models.device)
            metrics = {"train/samples": float(len(batch.texts))}
            if batch.texts:  # a slice can be empty when few answers were correct
                metrics["train/response_len"] = batch.response_mask.sum(1).mean().item()  # of the answers trained on
                metrics.update(supervised_update(cfg, parts, state, step, batch))
            parts.policy_schedule.step()
            with engine.sampling():
                parts.sampler.sync(policy)  # vLLM: the new weights, for evaluation
            metrics.update({"perf/step_s": time.perf_counter() - started, **clock.metrics()})
            log_step(cfg, parts, tracker, progress, step, metrics, last)
            advance(loss=metrics.get("train/loss", 0.0), acc=last["eval/accuracy"])
            end_step(cfg, parts, tracker, stop, state, step)
    return last


def supervised_update(cfg, parts: Parts, state: TrainState, step: int, batch: Rollout) -> dict[str, float]:
    """``trainer.epochs`` x ``trainer.minibatches`` updates on ``batch``, every row positive, no advantage."""
    mask = batch.response_mask
    kl = parts.components["kl"]
    in_loss = kl.wiring["placement"] == "loss" and kl.wiring["coef"] > 0
    ref_logp = parts.engine.logp(batch, cfg.rollout.temperature, reference=True) if in_loss else None
    positive = torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
    inputs = UpdateBatch(batch, torch.zeros_like(mask), positive, ref_logp=ref_logp)
    metrics, _ = update_step(cfg, parts, state, step, inputs)
    return metrics


def draw_samples(cfg, parts: Parts, progress, stop: StopRequests, counts: dict) -> tuple[Rollout, dict[str, float]]:
    """The initial policy's answers to every step's prompts, the correct ones kept, shuffled and saved; the answers
    drawn are added to ``counts`` (the run's compute)."""
    pad_id = parts.models.tokenizer.pad_token_id
    kept, drawn, correct = [], 0, 0
    with progress.task("RFT: sampling from the initial policy", total=cfg.trainer.steps) as advance:
        for step in range(1, cfg.trainer.steps + 1):
            batch, scores, _, sampling, _ = distributed.gather_samples(*sample_groups(cfg, parts, step), pad_id)
            count_sampled(counts, sampling)
            right = (scores > 0).nonzero().squeeze(1)
            kept.append(batch.select(right).to(torch.device("cpu")))
            drawn, correct = drawn + len(scores), correct + len(right)
            advance(accuracy=correct / drawn)
            stop.requested = distributed.first_signal(stop.requested)
            if stop.requested:
                raise stop.stop(
                    f"while RFT sampled its answers (step {step} of {cfg.trainer.steps}), before any update"
                )
    whole = Rollout.concat(kept, pad_id)
    order = torch.randperm(len(whole.texts), generator=torch.Generator().manual_seed(cfg.seed))
    whole = whole.select(order)
    samples = Rollout(**{name: getattr(whole, name) for name in TENSORS}, texts=whole.texts)
    save_samples(cfg, samples)
    return samples, {"rft/sampled": float(drawn), "rft/correct": float(correct), "rft/accuracy": correct / drawn}


def drawn_for(cfg) -> dict[str, int]:
    """The settings that decide which answers RFT draws; a resumed run must have the same."""
    keys = ("trainer.steps", "rollout.prompts_per_step", "rollout.group_size", "seed")
    return {key: OmegaConf.select(cfg, key) for key in keys}


def save_samples(cfg, samples: Rollout) -> None:
    """``trainer.output_dir/rft_samples/``: the kept answers' tensors (safetensors) and texts (JSON), written to a
    temporary directory and renamed; rank 0 writes."""
    from safetensors.torch import save_file

    if not distributed.is_main():
        return
    root = Path(cfg.trainer.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".rft-"))
    save_file({name: getattr(samples, name).contiguous() for name in TENSORS}, str(tmp / "samples.safetensors"))
    (tmp / "samples.json").write_text(json.dumps({"drawn_for": drawn_for(cfg), "texts": samples.texts}))
    target = root / SAMPLES
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


def load_samples(cfg) -> Rollout:
    """The answers a resumed run drew at its start; one line if they are missing or were drawn for other settings."""
    from safetensors.torch import load_file

    path = Path(cfg.trainer.output_dir) / SAMPLES
    if not (path / "samples.json").is_file():
        raise UserError(
            f"{path} is missing: a resumed RFT run trains on the answers it drew at its start "
            "(valid: start again in a new trainer.output_dir)"
        )
    saved = json.loads((path / "samples.json").read_text())
    now = drawn_for(cfg)
    for key, value in saved["drawn_for"].items():
        if now[key] != value:
            raise UserError(
                f"{key}={now[key]} does not fit the RFT answers in {path}, drawn for {key}={value} (valid: {value})"
            )
    tensors = load_file(str(path / "samples.safetensors"))
    return Rollout(**{name: tensors[name] for name in TENSORS}, texts=saved["texts"])
