"""Step 3 of a run: build everything the loop needs from the validated config."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlx_cli.config.choices import resolve_precision
from rlx_cli.config.compose import choice_config
from rlx_cli.config.errors import UserError
from rlx_cli.engine import distributed
from rlx_cli.engine.behaviour import Behaviour, behaviour_of
from rlx_cli.engine.engine import Engine
from rlx_cli.engine.models import Models, build_models, pick_device
from rlx_cli.engine.precision import frozen_dtype
from rlx_cli.engine.sharding import make_optimizer
from rlx_cli.sampling.gym_task import SPACE_DRAWS, GymTask
from rlx_cli.sampling.judge import judged
from rlx_cli.sampling.pairs import PairsTask
from rlx_cli.sampling.rollout import HFSampler
from rlx_cli.sampling.tasks import FileTask, SumsTask


@dataclass
class Component:
    """A registered function with its hyperparameters and the engine's wiring keys."""

    fn: Callable
    hparams: dict[str, Any]
    wiring: dict[str, Any]

    def __call__(self, tensors: dict[str, Any], **engine_kwargs):
        """Call ``fn`` with the tensors its positional parameters name; ``engine_kwargs`` only if it takes them."""
        params = inspect.signature(self.fn).parameters.values()
        args = [tensors[p.name] for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        accepted = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        return self.fn(*args, **self.hparams, **{k: v for k, v in engine_kwargs.items() if k in accepted})

    def takes(self, name: str) -> bool:
        return name in inspect.signature(self.fn).parameters


@dataclass
class Parts:
    models: Models
    task: Any
    sampler: HFSampler  # or a VLLMSampler: generate(model, prompts, ...) -> Rollout and sync(model)
    components: dict[str, Component]
    policy_optimizer: torch.optim.Optimizer
    policy_schedule: torch.optim.lr_scheduler.LRScheduler
    critic_optimizer: torch.optim.Optimizer | None
    engine: Engine  # micro-batched forwards, sampling and the update's mechanics (rlx_cli/engine/engine.py)
    behaviour: Behaviour | None = None  # a stale or bf16 copy that samples (rollout.lag, .dtype); None: the policy


def components_of(cfg: DictConfig) -> dict[str, Component]:
    from components import registry

    return {
        group: Component(*registry.split(group, OmegaConf.to_container(cfg[group], resolve=True)))
        for group in registry.WIRING_KEYS
    }


def thread_counts(cfg: DictConfig, cores: int | None = None) -> tuple[int, int]:
    """The torch threads of (the trainer, the sampler process of ``rollout.overlap``); 0: torch's default.

    ``trainer.threads`` and ``rollout.threads`` as set; under ``rollout.overlap`` a 0 is what the other leaves of the
    ``cores`` (default: those this process may run on), half each when both are 0, at least 1: two busy processes
    that each took every core would share them, four threads on two cores (docs/benchmarks.md, overlap)."""
    trainer, sampler = cfg.trainer.threads, cfg.rollout.get("threads", 0)
    if not cfg.rollout.get("overlap") or (trainer and sampler):
        return trainer, sampler
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if not trainer and not sampler:
        sampler = max(1, cores // 2)
    if not trainer:
        return max(1, cores - sampler), sampler
    return trainer, max(1, cores - trainer)


def build(cfg: DictConfig, progress) -> Parts:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars say what is happening
    hf_logging.set_verbosity_error()
    threads = thread_counts(cfg)[0]
    if threads:
        torch.set_num_threads(threads)
    task = build_task(cfg.task)
    for line in meaning_notes(cfg, task):
        progress.note(line)
    device = pick_device(cfg.trainer.device)
    precision = resolve_precision(cfg.trainer.precision, device)
    task = judged(task, cfg.task, device, frozen_dtype(precision, "auto"))  # task.verifier=judge: a model scores
    path = Path(cfg.model.path) if cfg.model.path else built_in_base(cfg, task, progress, device)
    components = components_of(cfg)
    if components["advantage"].takes("step_rewards") and not getattr(task, "scores_steps", False):
        raise UserError(
            f"advantage={cfg.advantage.name} needs a reward per step, which task={cfg.task.name} does not give "
            "(valid: task=sums, or task=jsonl with task.step_verifier=module:function)"
        )
    needs_critic = components["advantage"].takes("values")
    torch.manual_seed(cfg.seed)
    models = build_models(
        path,
        cfg.model,
        needs_critic=needs_critic,
        critic_cfg=cfg.critic,
        device=device,
        precision=precision,
        compile=cfg.trainer.compile,
    )
    distributed.broadcast_weights(models.policy, models.critic)  # every process starts from rank 0's weights
    engine = Engine(models, micro_batch_tokens=cfg.trainer.micro_batch_tokens, strategy=cfg.trainer.strategy,
                    loss_scale=cfg.trainer.loss_scale)  # fmt: skip
    strategy = engine.strategy
    policy_params = [p for n, p in models.policy.named_parameters() if p.requires_grad and ".critic." not in n]
    policy_optimizer = make_optimizer(policy_params, cfg.trainer.lr, cfg.trainer, strategy)  # after sharding
    warmup = max(1, cfg.trainer.warmup_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(policy_optimizer, lambda s: min(1.0, (s + 1) / warmup))
    critic_optimizer = None
    if models.critic is not None:
        critic_optimizer = make_optimizer(models.critic.trainable_parameters(), cfg.critic.lr, cfg.trainer, strategy)
    sampler = SAMPLERS[cfg.rollout.name](cfg, models, path)
    if cfg.rollout.name == "fast":
        from rlx_cli.sampling.fast_rollout import decode_path

        progress.note(f"rollout=fast decodes with {decode_path(models.policy)}")
        unread = unread_generation_settings(path)
        if unread:
            progress.note(f"rollout=fast does not apply {path}/generation_config.json's {unread} (rollout=hf does)")
    behaviour = behaviour_of(models.policy, cfg.rollout)
    return Parts(models, task, sampler, components, policy_optimizer, schedule, critic_optimizer, engine, behaviour)


# advantages whose baseline is the rest of the answer's group: alone in it, an answer keeps its raw score
BASELINE_FROM_THE_GROUP = ("grpo", "rloo")


def meaning_notes(cfg: DictConfig, task) -> list[str]:
    """What the settings silently make of the method, a line each at start-up: a group of one under an advantage
    whose baseline is the group (REINFORCE without a baseline), a task=gym config whose question space holds fewer
    distinct training questions than the run draws."""
    notes, size = [], cfg.rollout.group_size
    if size == 1 and cfg.advantage.name in BASELINE_FROM_THE_GROUP:
        notes.append(
            f"rollout.group_size=1: advantage={cfg.advantage.name} has no other answer to compare each with, so an "
            "answer's advantage is its raw score: REINFORCE without a baseline"
        )
    if hasattr(task, "distinct_training_questions"):  # task=gym
        dpo = cfg.trainer.loop == "dpo"  # its pairs draw preference.pool_prompts once; the others, every step
        draws = cfg.preference.pool_prompts if dpo else cfg.trainer.steps * cfg.rollout.prompts_per_step
        what = "preference.pool_prompts" if dpo else "trainer.steps x rollout.prompts_per_step"
        found = task.distinct_training_questions(min(draws - 1, SPACE_DRAWS // 2))  # half: the draws saturated
        if found is not None:
            config = ", ".join(f"{k}: {v}" for k, v in (cfg.task.get("config") or {}).items())
            notes.append(
                f"task.dataset={cfg.task.dataset} task.config={{{config}}}: {SPACE_DRAWS:,} draws find {found:,} "
                f"distinct training questions (the held-out ones excluded), fewer than the {draws:,} this run draws "
                f"({what}): it trains on the same questions again"
            )
    return notes


def built_in_base(cfg: DictConfig, task, progress, device) -> Path:
    """The built-in base model (no ``model.path``): SFT'd on the task's own answers, or, for a file whose
    rows are sums (``examples/sums_pairs.jsonl``), the default ``task=sums`` base, whose tokenizer writes them."""
    from rlx_cli.engine.base_model import CHARS, ensure_base_model

    if hasattr(task, "sft_examples"):
        return ensure_base_model(cfg.model, cfg.task, task, progress, device)
    foreign = sorted(set("".join(task.texts())) - set(CHARS))
    if foreign:
        raise UserError(
            f"model={cfg.model.name} with no model.path writes only the characters {CHARS!r}, and "
            f"task.path={cfg.task.path} has {''.join(foreign[:12])!r}: use model=hf model.path=DIR"
        )
    sums = choice_config("task", "sums")
    return ensure_base_model(cfg.model, sums, build_task(sums), progress, device)


def hf_sampler(cfg: DictConfig, models: Models, path: Path) -> HFSampler:
    rollout = cfg.rollout
    chat_template = cfg.task.get("chat_template", False)
    return HFSampler(models.tokenizer, top_p=rollout.top_p, chat_template=chat_template, rows=rollout.generate_rows)


def fast_sampler(cfg: DictConfig, models: Models, path: Path) -> HFSampler:
    from rlx_cli.sampling.fast_rollout import FastSampler, check_architecture

    rollout = cfg.rollout
    check_architecture(models.policy)
    chat_template = cfg.task.get("chat_template", False)
    sampling = dict(top_p=rollout.top_p, top_k=rollout.top_k)
    return FastSampler(
        models.tokenizer,
        **sampling,
        chat_template=chat_template,
        rows=rollout.generate_rows,
        cuda_graphs=rollout.cuda_graphs,
    )


# generation_config.json keys that change which tokens generate draws and that rollout=fast does not apply (rlx sets
# temperature, top-p, top-k and the budget itself, from rollout.*)
DECODING_KEYS = ("repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
                 "force_words_ids", "min_length", "min_new_tokens", "min_p", "typical_p", "epsilon_cutoff",
                 "eta_cutoff", "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
                 "sequence_bias", "exponential_decay_length_penalty", "guidance_scale", "num_beams", "penalty_alpha",
                 "stop_strings", "watermarking_config")  # fmt: skip


def unread_generation_settings(path: Path) -> str:
    """The settings of the model directory's ``generation_config.json`` that change generate's draws and that
    ``rollout=fast`` does not apply (``repetition_penalty=1.1, min_new_tokens=4``), "" if none or no such file."""
    from transformers import GenerationConfig

    if not (Path(path) / "generation_config.json").is_file():
        return ""
    settings, default = GenerationConfig.from_pretrained(path), GenerationConfig()
    changed = {k: getattr(settings, k, None) for k in DECODING_KEYS}
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items()) if v != getattr(default, k, None))


def vllm_sampler(cfg: DictConfig, models: Models, path: Path) -> HFSampler:
    from rlx_cli.sampling.vllm_rollout import VLLMSampler  # vllm is an extra: imported only when asked for

    chat_template = cfg.task.get("chat_template", False)
    dtype = frozen_dtype(resolve_precision(cfg.trainer.precision, models.device), cfg.model.dtype)
    return VLLMSampler(
        path, models.tokenizer, cfg.rollout, cfg.model, chat_template=chat_template, seed=cfg.seed, dtype=dtype
    )


SAMPLERS = {"hf": hf_sampler, "fast": fast_sampler, "vllm": vllm_sampler}  # rollout.name -> the sampler's builder


# task keys that are not the task's: the judge's (sampling/judge.py), the samplers' chat_template, and task=gym's table
# of default task.config per dataset (resolved into task.config when the config composes)
READ_ELSEWHERE = ("name", "judge", "chat_template", "difficulty")
TASKS = {"sums": SumsTask, "jsonl": FileTask, "pairs": PairsTask, "gym": GymTask}  # task.name -> the task's class


def build_task(cfg: DictConfig) -> SumsTask | FileTask | PairsTask | GymTask:
    params = {k: v for k, v in cfg.items() if k not in READ_ELSEWHERE}
    return TASKS[cfg.name](**params)
