"""Which config groups a composition actually uses, read from its components' signatures."""

from __future__ import annotations

from omegaconf import DictConfig

from rlx_cli.config import signatures

PREFERENCE_LOOPS = ("dpo", "online_dpo")  # trainer.loop values that train on pairs (loops/dpo.py, loops/online_dpo.py)
FROM_POLICY = ("policy", "reward_model")  # critic.init values that start the critic from the policy's weights


def unused_groups(cfg: DictConfig) -> set[str]:
    """Groups whose settings cannot change this run: λ without GAE, critic settings without a critic. Read from the
    components' signatures without importing them (an unknown advantage counts as taking nothing: ``validate`` names
    it)."""
    advantage = signatures.table()["advantage"].get(cfg.advantage.name)
    params = advantage.parameters if advantage is not None else ()
    unused = set()
    if "lam" not in params:
        unused.add("lam_schedule")
    if "values" not in params:
        unused |= {"critic", "value_pretrain", "value_loss"}
    if cfg.trainer.loop in PREFERENCE_LOOPS:  # they use the preference loss alone
        unused |= {"advantage", "lam_schedule", "policy_loss", "loss_agg", "kl", "lm_loss", "reward_shaping"}
        unused |= {"token_filter", "critic", "value_pretrain", "value_loss"}
    else:
        unused.add("preference")
    return unused
