"""Which config groups a composition actually uses, read from its components' signatures."""

from __future__ import annotations

import inspect

from omegaconf import DictConfig


def unused_groups(cfg: DictConfig) -> set[str]:
    """Groups whose settings cannot change this run: λ without GAE, critic settings without a critic."""
    from components import registry

    params = inspect.signature(registry.get("advantage", cfg.advantage.name)).parameters
    unused = set()
    if "lam" not in params:
        unused.add("lam_schedule")
    if "values" not in params:
        unused |= {"critic", "value_pretrain", "value_loss"}
    return unused
