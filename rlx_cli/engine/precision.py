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

from contextlib import nullcontext

import torch


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
