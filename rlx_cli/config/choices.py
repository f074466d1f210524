"""The valid values of keys that the layers above interpret, kept here so that ``validate`` checks them without
importing those layers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # composing needs no torch: a wrong choice or key is reported in 0.5 s, not 2 s
    import torch

PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16-true")  # trainer.precision (engine/precision.py)
STRATEGIES = ("ddp", "zero1", "fsdp")  # trainer.strategy (engine/sharding.py)
TRAINING_LOOPS = ("rl", "rft", "dpo", "online_dpo")  # trainer.loop (loops/run.py's LOOPS: the module of each)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` is ``bf16-mixed`` on a GPU and ``fp32`` on the CPU."""
    if precision == "auto":
        return "bf16-mixed" if device.type == "cuda" else "fp32"
    return precision
