"""policy_loss.ppo_clip and value_loss.clipped on hand-computed tensors."""

import math

import pytest
import torch

from components import policy_loss, value_loss

# eps_low 0.2, eps_high 0.28, clip_ratio_c 3; one row of five real tokens and one padded token
RATIOS = [1.1, 1.5, 0.5, 4.0, 1.1]
ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0, -1.0, -2.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
KW = {"eps_low": 0.2, "eps_high": 0.28, "clip_ratio_c": 3.0}


def inputs():
    old = torch.full((1, 6), -1.0, requires_grad=True)
    logp = (old.detach() + torch.tensor([[math.log(r) for r in RATIOS] + [50.0]])).requires_grad_(True)
    return logp, old


def test_ppo_clip_by_hand():
    logp, old = inputs()
    loss, metrics = policy_loss.ppo_clip(logp, old, ADVANTAGES, MASK, **KW)
    # t0 A=+1 r=1.1 unclipped: -1.1
    # t1 A=+1 r=1.5 > 1.28: max(-1.5, -1.28) = -1.28               (clip high)
    # t2 A=-1 r=0.5 < 0.8: max(0.5, 0.8) = 0.8                     (clip low)
    # t3 A=-1 r=4: max(4, 1.28) = 4, dual clip min(4, 1·3) = 3      (dual clip)
    # t4 A=-2 r=1.1: max(2.2, 2.2) = 2.2, min(2.2, 6) = 2.2
    # token_mean = (-1.1 - 1.28 + 0.8 + 3 + 2.2) / 5 = 3.62 / 5
    assert loss.item() == pytest.approx(0.724, abs=1e-5)
    assert metrics["clip_frac_high"].item() == pytest.approx(0.2)
    assert metrics["clip_frac_low"].item() == pytest.approx(0.2)
    assert metrics["dual_clip_frac"].item() == pytest.approx(0.2)
    assert metrics["ratio_mean"].item() == pytest.approx(8.2 / 5, abs=1e-5)  # (1.1+1.5+0.5+4+1.1)/5
    assert metrics["ratio_max"].item() == pytest.approx(4.0, abs=1e-5)  # the padded ratio e^51 is ignored
    assert metrics["approx_kl"].item() == pytest.approx(-math.log(1.1 * 1.5 * 0.5 * 4.0 * 1.1) / 5, abs=1e-5)
    assert set(metrics) == {"clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean", "ratio_max", "dual_clip_frac"}
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def test_ppo_clip_gradient_reaches_logp_only():
    logp, old = inputs()
    loss, _ = policy_loss.ppo_clip(logp, old, ADVANTAGES, MASK, **KW)
    loss.backward()
    # d/dlogp of -A·ratio is -A·ratio; clipped and dual-clipped tokens get none; /5 for the token mean
    assert torch.allclose(logp.grad, torch.tensor([[-1.1 / 5, 0.0, 0.0, 0.0, 2.2 / 5, 0.0]]), atol=1e-6)
    assert old.grad is None


def test_ppo_clip_symmetric_defaults_and_agg():
    logp, old = inputs()
    loss, metrics = policy_loss.ppo_clip(logp, old, ADVANTAGES, MASK, agg="seq_mean_token_sum")
    # eps_high 0.2: t1 -> max(-1.5, -1.2) = -1.2; the rest as above; one row, so the token sum
    assert loss.item() == pytest.approx(-1.1 - 1.2 + 0.8 + 3.0 + 2.2, abs=1e-5)
    assert metrics["clip_frac_high"].item() == pytest.approx(0.2)


def test_ppo_clip_ratio_one_is_minus_mean_advantage():
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 5.0, 0.0]])
    loss, metrics = policy_loss.ppo_clip(logp, logp, adv, torch.ones(2, 3))
    assert loss.item() == pytest.approx(-(1 + 2 + 3 - 1 + 5) / 6)
    assert metrics["approx_kl"].item() == 0.0 and metrics["ratio_max"].item() == 1.0


def test_ppo_clip_empty_mask_is_finite():
    loss, metrics = policy_loss.ppo_clip(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2))
    assert loss.item() == 0.0 and metrics["ratio_max"].item() == 0.0


def test_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.5, 9.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0, 0.5, 0.0]], requires_grad=True)
    returns = torch.tensor([[2.0, 1.0, 0.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = value_loss.clipped(values, old, returns, mask, clip=0.2)
    # t0: (1-2)² = 1; clip(1, 0.3, 0.7) = 0.7 -> (0.7-2)² = 1.69 -> 1.69 (clipped term wins)
    # t1: (0-1)² = 1, clipped 0 -> 1;  t2: (0.5-0)² = 0.25, clipped 0.5 -> 0.25
    # 0.5 · (1.69 + 1 + 0.25) / 3 = 0.49
    assert loss.item() == pytest.approx(0.49)
    assert metrics["clip_frac"].item() == pytest.approx(1 / 3)
    assert metrics["value_mean"].item() == pytest.approx(0.5)
    assert metrics["return_mean"].item() == pytest.approx(1.0)
    loss.backward()
    assert values.grad[0, 0].item() == 0.0  # the clipped branch is flat in v
    assert values.grad[0, 1].item() == pytest.approx(-1 / 3)  # 0.5 · 2(v - R) / 3
    assert old.grad is None
    unclipped, _ = value_loss.clipped(values, old, returns, mask, clip=None)
    assert unclipped.item() == pytest.approx(0.5 * (1 + 1 + 0.25) / 3)
