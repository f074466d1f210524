"""The behaviour policy: what samples when it is not the policy being trained.

``rollout.lag=k`` samples step s from the policy after step s − 1 − k (the initial one while s − 1 − k < 0), as an
asynchronous trainer's stale samples; ``rollout.dtype=bf16`` samples from a bfloat16 copy, the CPU stand-in for an
inference engine's precision gap. Either way a copy of the policy samples: before each step it takes the weights of
the version the lag asks for, from the last k + 1 versions of the trainable parameters it keeps (the frozen ones
never change). Those versions are part of a checkpoint, so a resumed run samples exactly as an uninterrupted one.
With ``rollout.overlap`` the copy takes the next step's version a step early (``load(ahead=1)``), in shared memory;
on a GPU ``load`` returns once its copies are done, so the sampler process, which reads the copy through CUDA IPC on
its own stream, never samples from half-written weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlx_cli.engine.precision import copy_in_dtype

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # rollout.dtype


class Behaviour:
    """A copy of ``policy`` in ``dtype`` that samples with the weights of ``lag`` steps ago (one version a step)."""

    def __init__(self, policy: nn.Module, *, lag: int, dtype: str):
        self.lag = lag
        self.model = copy_in_dtype(policy, DTYPES[dtype])
        self.model.requires_grad_(False)
        if getattr(self.model, "_require_grads_hook", None) is not None:  # activation checkpointing's, for backward:
            self.model.disable_input_require_grads()  # the copy never trains, and rollout.overlap cannot pickle it
        self.versions: list[dict[str, Tensor]] = []  # oldest first; the newest is the policy at the last refresh

    def refresh(self, policy: nn.Module) -> nn.Module:
        """Keep the policy's current trainable weights as the newest version, load the one ``lag`` versions older
        (or the oldest kept) into the copy -> the copy, ready to sample."""
        self.keep(policy)
        return self.load()

    def keep(self, policy: nn.Module) -> None:
        """Keep the policy's current trainable weights as the newest version (the last ``lag`` + 1 are kept)."""
        self.versions.append({name: p.detach().clone() for name, p in trainable(policy).items()})
        del self.versions[: -(self.lag + 1)]

    def load(self, ahead: int = 0) -> nn.Module:
        """Load into the copy the version that step s + ``ahead`` samples with, s the step whose start ``keep`` took
        the newest version at (1 <= ``ahead`` <= ``lag``: a step sampled early, ``rollout.overlap``) -> the copy."""
        index = ahead if len(self.versions) == self.lag + 1 else 0  # early steps sample with the initial policy
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, weight in self.versions[index].items():
                params[name].copy_(weight)
        settle(self.model)
        return self.model

    def state(self) -> dict[str, Tensor]:
        """The kept versions as one flat dict: ``"<i>/<parameter name>"``, oldest first."""
        return {f"{i}/{name}": w for i, version in enumerate(self.versions) for name, w in version.items()}

    def load_state(self, tensors: dict[str, Tensor]) -> None:
        """The inverse of ``state``."""
        count = 1 + max((int(key.split("/", 1)[0]) for key in tensors), default=-1)
        self.versions = [{} for _ in range(count)]
        for key, weight in tensors.items():
            index, name = key.split("/", 1)
            self.versions[int(index)][name] = weight


def settle(model: nn.Module) -> None:
    """Wait for the copies queued into ``model`` on a GPU (none on the CPU, where ``copy_`` is done on return): another
    process reading its tensors through CUDA IPC sees none of this stream's pending work."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def behaviour_of(policy: nn.Module, rollout_cfg) -> Behaviour | None:
    """The behaviour policy ``rollout.lag`` / ``rollout.dtype`` ask for; None when the policy samples itself."""
    lag, dtype = rollout_cfg.get("lag", 0), rollout_cfg.get("dtype", "fp32")
    return Behaviour(policy, lag=lag, dtype=dtype) if lag or dtype != "fp32" else None
