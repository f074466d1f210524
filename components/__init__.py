"""The ingredients of RL fine-tuning: pure functions over tensors, registered by group and name."""

from components import (
    advantage,
    kl,
    lam_schedule,
    lm_loss,
    loss_agg,
    policy_loss,
    preference,
    registry,
    reward_shaping,
    rollout_correction,
    token_filter,
    value_loss,
)

__all__ = [
    "advantage",
    "kl",
    "lam_schedule",
    "lm_loss",
    "loss_agg",
    "policy_loss",
    "preference",
    "registry",
    "reward_shaping",
    "rollout_correction",
    "token_filter",
    "value_loss",
]
