"""Reward normalisation for soft rewards (advantage.reward_norm: none | group | batch), by hand."""

import math

import pytest
import torch

from components import advantage, registry

SCORES = torch.tensor([1.0, 0.0, 0.5, 0.5])  # two groups of two; the second ties
GROUPS = torch.tensor([0, 0, 1, 1])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
SQRT_HALF = math.sqrt(0.5)


def test_zscore_per_group_per_batch_and_none():
    # group 0: mean 0.5, unbiased std √0.5 -> ±0.5/√0.5 = ±√0.5; group 1: std 0 -> 0/(0 + eps) = 0
    assert advantage.zscore(SCORES, GROUPS, by="group").tolist() == pytest.approx([SQRT_HALF, -SQRT_HALF, 0, 0], 1e-5)
    # batch: mean 0.5, unbiased std √((0.25 + 0.25)/3) = 0.408248
    batch_std = math.sqrt(0.5 / 3)
    expected = [0.5 / batch_std, -0.5 / batch_std, 0.0, 0.0]
    assert advantage.zscore(SCORES, GROUPS, by="batch").tolist() == pytest.approx(expected, 1e-5)
    assert advantage.zscore(SCORES, GROUPS, by="none").tolist() == SCORES.tolist()
    assert advantage.zscore(torch.tensor([0.3, 0.9]), torch.tensor([0, 1]), by="group").tolist() == pytest.approx(
        [0.3, 0.9]  # singleton groups keep their raw scores, as in grpo
    )


def test_rloo_on_group_zscores():
    # K = 2: A = 2·(z − mean z) = 2·z in group 0 (mean 0): ±2·√0.5; group 1: 0
    adv = advantage.rloo(SCORES, GROUPS, MASK, reward_norm="group")
    assert adv[:, 0].tolist() == pytest.approx([2 * SQRT_HALF, -2 * SQRT_HALF, 0, 0], 1e-5)
    assert adv[1, 1].item() == 0.0  # padding


def test_reinforce_pp_replaces_the_score_and_keeps_the_kl():
    kl = torch.tensor([[0.1, 0.2], [0.3, 0.0], [0.0, 0.0], [0.0, 0.0]])
    rewards = advantage.token_rewards(SCORES, MASK, kl)
    z = advantage.zscore(SCORES, GROUPS, by="batch")
    expected = advantage.reinforce_pp(advantage.token_rewards(z, MASK, kl), MASK)  # as if the scores were z
    got = advantage.reinforce_pp(rewards, MASK, SCORES, GROUPS, reward_norm="batch")
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, advantage.reinforce_pp(rewards, MASK), atol=1e-3)  # it changed something
    baseline = advantage.reinforce_pp_baseline(rewards, GROUPS, MASK, SCORES, reward_norm="group")
    z_group = advantage.zscore(SCORES, GROUPS, by="group")
    assert torch.allclose(
        baseline, advantage.reinforce_pp_baseline(advantage.token_rewards(z_group, MASK, kl), GROUPS, MASK)
    )


def test_reward_norm_choices_are_checked():
    with pytest.raises(registry.RegistryError, match="advantage.reward_norm='global' is not valid"):
        registry.validate("advantage", {"name": "rloo", "reward_norm": "global", "whiten": False, "clip": None})
