"""``trainer.precision``: how training computes, and in which dtype it keeps the weights it trains.

- ``fp32``: weights, gradients, AdamW states and compute in float32 (the CPU default).
- ``bf16-mixed``: float32 master weights, gradients and AdamW states; forward and backward under bfloat16 autocast
  (the GPU default, as verl's FSDP actor, TRL and DeepSpeed's bf16 keep fp32 masters). Frozen weights (the
  reference copy, LoRA's base) may be bfloat16 (``model.dtype=auto``).
- ``bf16-true``: everything in bfloat16, weights and AdamW states included (rlx's GPU behaviour before
  ``trainer.precision`` existed). bfloat16 keeps 8 significant bits, so an update below about |w|·2⁻⁹ rounds away:
  at lr 1e-6 almost no weight moves. Use it only with learning rates near 1e-5 and above (torchtune's GRPO recipe).

LoRA adapters stay float32 under every precision (peft's ``autocast_adapter_dtype``); log-softmax, entropy and
the value head compute in float32 whatever the weights. Its choices and ``auto``: ``config/choices.py``.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch
from torch import nn


def trained_dtype(precision: str) -> torch.dtype:
    """The dtype of the weights that train (and of their AdamW states): the master copy."""
    return torch.bfloat16 if precision == "bf16-true" else torch.float32


def frozen_dtype(precision: str, model_dtype: str) -> torch.dtype:
    """``model.dtype`` for the weights that do not train: ``auto`` is bfloat16 when training computes in bf16."""
    if model_dtype == "auto":
        return torch.float32 if precision == "fp32" else torch.bfloat16
    return getattr(torch, model_dtype)


def compute_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of forward and backward passes (None: no autocast)."""
    return torch.bfloat16 if precision == "bf16-mixed" else None


def autocast(dtype: torch.dtype | None, device: torch.device):
    """bfloat16 autocast on ``device`` for ``bf16-mixed``; nothing otherwise."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def full_precision(device: torch.device):
    """Autocast off inside (float32 heads under ``bf16-mixed``)."""
    return torch.autocast(device.type, enabled=False)


def copy_in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``model`` in ``dtype`` as transformers' ``from_pretrained(..., dtype=dtype)`` makes one: floating
    parameters and the buffers a checkpoint holds (persistent ones) cast, except in the modules the model class keeps
    in float32 (``_keep_in_fp32_modules``); the buffers it computes at build time (non-persistent: the rotary
    frequencies ``inv_freq``) keep their dtype. ``model.to(bfloat16)`` would round those frequencies too, and the
    rotary angles with them: 0.07–0.36 nats of log-prob by position 512 against transformers' own bf16 model."""
    twin = copy.deepcopy(model)
    float32 = set().union(*(getattr(m, "_keep_in_fp32_modules", None) or () for m in twin.modules()))
    for name, module in twin.named_modules():
        if float32 & set(name.split(".")):
            continue
        for p in module._parameters.values():
            if p is not None and p.is_floating_point():
                p.data = p.data.to(dtype)
        for key, b in module._buffers.items():
            if b is not None and b.is_floating_point() and key not in module._non_persistent_buffers_set:
                module._buffers[key] = b.to(dtype)
    return twin
