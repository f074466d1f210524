"""Checkpoints: everything a run needs to continue exactly where it stopped, written atomically.

``<trainer.output_dir>/checkpoints/step-000040/`` holds

- ``policy.safetensors``: the policy's trainable parameters (all weights, or the LoRA adapters);
- ``critic.safetensors``: the critic's own parameters (with LoRA only the value head; its adapter is the policy's);
- ``behaviour.safetensors``: with ``rollout.lag`` / ``rollout.dtype``, the policy versions the sampling copy keeps;
- ``state.safetensors`` + ``state.json``: the optimizer and LR-schedule states, the reward-shaping statistics,
  the RNG state, the step, the latest metrics, the MLflow run id and the groups carried to the next step
  (``rollout.carry_surplus``: their answers, scores and origins); tensors in safetensors, the rest JSON.

No pickle anywhere. A checkpoint is written under ``checkpoints/.tmp-*`` and then renamed, so every
``step-*`` directory is complete; the newest ``trainer.keep_ckpts`` are kept. The training prompts are a
pure function of (seed, step), so the step is also the position in the data.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig

from rlx_cli.config.errors import UserError
from rlx_cli.engine import distributed
from rlx_cli.engine.behaviour import trainable
from rlx_cli.engine.sharding import full_optimizer_state, full_tensors, load_optimizer_state, load_tensors
from rlx_cli.loops.groups import Groups

if TYPE_CHECKING:
    from rlx_cli.loops.build import Parts

CHECKPOINTS = "checkpoints"


@dataclass
class TrainState:
    """What the RL loop carries from one step to the next besides the models and optimizers."""

    step: int = 0  # the last step done
    metrics: dict[str, float] = field(default_factory=dict)  # the latest value of every metric
    shaping: dict[str, Any] = field(default_factory=dict)  # reward_shaping's running statistics
    skipped: int = 0  # updates skipped for a non-finite loss or gradient, in all
    skipped_in_a_row: int = 0
    run_id: str | None = None  # the MLflow run this training logs into
    reward_errors: int = 0  # the task's verifier errors and time-outs so far, all processes: carried over a resume
    compute: dict[str, float] = field(default_factory=dict)  # samples, tokens, train_tokens, wall_s (loops/compute.py)
    carried: Groups = field(default_factory=Groups)  # informative groups waiting for the next step (carry_surplus)


def save(output_dir: str | Path, parts: Parts, state: TrainState, keep: int) -> Path:
    """Write ``checkpoints/step-<state.step>`` atomically; delete all but the newest ``keep``; -> its path.

    With N processes every process calls it (sharded weights and optimizer states are gathered whole:
    ``sharding.full_tensors``), rank 0 writes it (the RNG state is rank 0's) and every process returns its path.
    """
    from safetensors.torch import save_file

    root = Path(output_dir) / CHECKPOINTS
    target = root / f"step-{state.step:06d}"
    critic = parts.models.critic
    policy_weights = full_tensors(trainable(parts.models.policy))
    critic_weights = full_tensors(critic.state_dict()) if critic is not None else None
    optimizers = {
        "policy_optimizer": full_optimizer_state(parts.policy_optimizer),
        "critic_optimizer": full_optimizer_state(parts.critic_optimizer) if parts.critic_optimizer else None,
    }
    state.reward_errors = int(distributed.total(parts.task.reward_errors))  # the task counts, the checkpoint keeps
    if not distributed.is_main():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    save_file(policy_weights, str(tmp / "policy.safetensors"))
    if critic_weights is not None:
        save_file(critic_weights, str(tmp / "critic.safetensors"))
    if parts.behaviour is not None:
        save_file({k: v.contiguous() for k, v in parts.behaviour.state().items()}, str(tmp / "behaviour.safetensors"))
    full_state = {
        **dataclasses.asdict(state),
        **optimizers,
        "policy_schedule": parts.policy_schedule.state_dict(),
        "rng": rng_states(),
    }
    tensors: dict[str, torch.Tensor] = {}
    skeleton = pack(full_state, "", tensors)
    save_file(tensors, str(tmp / "state.safetensors"))
    (tmp / "state.json").write_text(json.dumps(skeleton))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    for old in complete(root)[:-keep]:
        shutil.rmtree(old)
    for leftover in root.glob(".tmp-*"):  # from a process killed while it wrote
        shutil.rmtree(leftover, ignore_errors=True)
    return target


def complete(root: Path) -> list[Path]:
    """The complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if (p / "state.json").is_file() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest(output_dir: str | Path) -> Path | None:
    found = complete(Path(output_dir) / CHECKPOINTS)
    return found[-1] if found else None


def check_output_dir(cfg: DictConfig) -> None:
    """A fresh run must not mix its checkpoints with another run's in the same ``trainer.output_dir``."""
    if not cfg.trainer.resume and latest(cfg.trainer.output_dir) is not None:
        raise UserError(
            f"trainer.output_dir={cfg.trainer.output_dir} holds another run's checkpoints "
            "(valid: trainer.resume=true to continue it, or a new trainer.output_dir)"
        )


def resume(cfg: DictConfig, parts: Parts, progress) -> TrainState:
    """A fresh state, or with ``trainer.resume=true`` the newest complete checkpoint's, restored into ``parts``."""
    if not cfg.trainer.resume:
        return TrainState()
    path = latest(cfg.trainer.output_dir)
    if path is None:
        where = Path(cfg.trainer.output_dir) / CHECKPOINTS
        progress.note(f"trainer.resume=true: no checkpoint in {where}, starting fresh")
        return TrainState()
    state = load(path, parts)
    progress.note(f"resuming from {path} (step {state.step} of {cfg.trainer.steps})")
    return state


def load(path: Path, parts: Parts) -> TrainState:
    """Restore the models, optimizers, schedule and RNG from the checkpoint at ``path``; -> the loop's state."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    models, reading = parts.models, path / "policy.safetensors"
    try:
        restore(trainable(models.policy), load_file(reading), "policy")
        if models.critic is not None:
            reading = path / "critic.safetensors"
            restore(models.critic.state_dict(keep_vars=True), load_file(reading), "critic")
        if parts.behaviour is not None:
            reading = path / "behaviour.safetensors"
            parts.behaviour.load_state(load_file(reading))
        reading = path / "state.json"
        skeleton = json.loads(reading.read_text())
        reading = path / "state.safetensors"
        state = unpack(skeleton, load_file(reading))
        load_optimizer_state(parts.policy_optimizer, state.pop("policy_optimizer"))
        parts.policy_schedule.load_state_dict(state.pop("policy_schedule"))
        critic_optimizer = state.pop("critic_optimizer")
        if parts.critic_optimizer is not None:
            load_optimizer_state(parts.critic_optimizer, critic_optimizer)
        set_rng_states(state.pop("rng"))
        carried = state.pop("carried", None)
        restored = TrainState(**state, carried=Groups.restored(carried))
        if distributed.is_main():  # the count of all processes goes on in one; the metric sums them
            parts.task.reward_errors = restored.reward_errors
        return restored
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(
            f"checkpoint {reading} does not fit this run ({reason[:200]}); resume with the overrides that wrote "
            f"it, or delete {path}"
        ) from error


def restore(params: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], what: str) -> None:
    if params.keys() != saved.keys():
        raise ValueError(f"its {what} parameters are not this config's")
    load_tensors(params, saved)


def rng_states() -> dict[str, Any]:
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def pack(node: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Nested state -> a JSON skeleton; each tensor moves to ``tensors[key]``, each dict keeps its key types."""
    if isinstance(node, torch.Tensor):
        tensors[key] = node.detach().cpu().contiguous()
        return {"tensor": key}
    if isinstance(node, dict):
        return {"dict": [[k, pack(v, f"{key}/{k}", tensors)] for k, v in node.items()]}
    if isinstance(node, (list, tuple)):
        return [pack(v, f"{key}/{i}", tensors) for i, v in enumerate(node)]
    return node


def unpack(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of ``pack`` (tuples come back as lists)."""
    if isinstance(node, dict):
        if "tensor" in node:
            return tensors[node["tensor"]]
        return {k: unpack(v, tensors) for k, v in node["dict"]}
    if isinstance(node, list):
        return [unpack(v, tensors) for v in node]
    return node
