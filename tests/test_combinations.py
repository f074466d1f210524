"""Every advantage, every loss aggregation, every KL placement and every policy loss train on the default (a
covering set).

The full product (5 x 4 x 3 = 60 runs) is slow; each row below is one 2-step run, and together the rows use
every advantage, every ``loss_agg.mode`` and every KL placement (none, in the reward, in the loss); the policy
losses besides ``ppo_clip`` run once each with a critic or a group baseline.
"""

from __future__ import annotations

import math

import pytest
from conftest import SHORT

from rlx_cli.loops.run import train_command

COMBINATIONS = [
    ("gae", "token_mean", ["kl=estimate", "kl.placement=reward", "kl.kind=k1"]),
    ("grpo", "seq_mean_token_mean", ["kl=estimate", "kl.placement=loss", "kl.kind=k3"]),
    ("rloo", "seq_mean_token_sum", ["kl=none"]),
    ("reinforce_pp", "seq_mean_token_sum_norm", ["kl=estimate", "kl.placement=reward", "kl.kind=abs"]),
    ("reinforce_pp_baseline", "token_mean", ["kl=estimate", "kl.placement=loss", "kl.kind=k2"]),
    ("gae", "seq_mean_token_sum_norm", ["kl=estimate", "kl.placement=loss", "kl.kind=k3"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("advantage", "mode", "kl"), COMBINATIONS)
def test_two_steps_train(workdir, advantage, mode, kl):
    steps = [a for a in SHORT if not a.startswith("trainer.steps=")]
    final = train_command(
        [
            f"advantage={advantage}",
            f"loss_agg.mode={mode}",
            *kl,
            "trainer.steps=2",
            *steps,
            "tracking=none",
            "trainer.output_dir=out",
        ]
    )
    assert all(math.isfinite(final[k]) for k in ("train/loss", "train/kl", "train/entropy"))
    assert final.get("train/skipped_steps", 0) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("loss", "advantage", "mode"), [("clip_cov", "gae", "seq_mean_token_sum"), ("kl_cov", "rloo", "token_mean")]
)
def test_each_policy_loss_trains(workdir, loss, advantage, mode):
    steps = [a for a in SHORT if not a.startswith("trainer.steps=")]
    overrides = [f"policy_loss={loss}", f"advantage={advantage}", f"loss_agg.mode={mode}", "trainer.steps=2", *steps]
    final = train_command([*overrides, "tracking=none", "trainer.output_dir=out"])
    assert all(math.isfinite(final[k]) for k in ("train/loss", "train/entropy", "train/cov_mean", "train/cov_frac"))
    assert final.get("train/skipped_steps", 0) == 0
