"""GSPO, CISPO, SAPO and GMPO against values and gradients worked out by hand (with ``math``, not torch)."""

from __future__ import annotations

import math

import pytest
import torch

from components import policy_loss as pl


def leaf(rows):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=True)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def close(x, expected, tol):
    """``x`` equals the nested list ``expected`` to ``tol``, elementwise."""
    torch.testing.assert_close(x.double(), torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


def test_gspo_clips_the_sequence_ratio_and_gives_every_token_the_rows_gradient():
    # row 0: log r = 0.1, -0.3 (padding after) -> s = e^-0.1, inside [0.8, 1.2]; row 1: s = e^0.3 > 1.2, A > 0: clipped
    logp = leaf([[0.1, -0.3, 5.0], [0.3, 0.3, 0.3]])
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv = t([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    loss, metrics = pl.gspo(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, agg="seq_mean_token_mean")
    s0 = math.exp(-0.1)
    assert loss.item() == pytest.approx((-s0 - 1.2) / 2, abs=1e-12)
    loss.backward()
    # every real token of row 0 gets -A·s0 / (2 rows · 2 tokens), not its own ratio (token PPO: e^0.1, e^-0.3)
    close(logp.grad, [[-s0 / 4, -s0 / 4, 0.0], [0.0, 0.0, 0.0]], 1e-12)
    assert metrics["clip_frac_high"].item() == pytest.approx(3 / 5)  # the 3 real tokens of row 1
    assert metrics["seq_ratio_max"].item() == pytest.approx(math.exp(0.3))
    assert metrics["seq_ratio_mean"].item() == pytest.approx((s0 + math.exp(0.3)) / 2)


def test_gspo_clamps_the_log_sequence_ratio_at_ten():
    logp = leaf([[30.0, 10.0]])
    loss, _ = pl.gspo(logp, t([[0.0, 0.0]]), t([[-1.0, -1.0]]), t([[1, 1]]), eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(math.exp(10.0))  # A < 0, s = e^20 clamped to e^10: −A·s


def test_cispo_clips_the_weight_but_keeps_every_tokens_gradient():
    logp = leaf([[-1.0, -2.0]])
    old, adv, mask = t([[-1.5, -1.0]]), t([[2.0, -1.0]]), t([[1, 1]])
    # r = e^0.5 (capped at 1 + 0.5) and e^-1 (no lower bound): L = -w·A·logp, token mean
    loss, metrics = pl.cispo(logp, old, adv, mask, eps_low=None, eps_high=0.5)
    w2 = math.exp(-1.0)
    assert loss.item() == pytest.approx((-1.5 * 2 * -1.0 + -w2 * -1.0 * -2.0) / 2, abs=1e-12)
    loss.backward()
    close(logp.grad, [[-1.5 * 2 / 2, -w2 * -1.0 / 2]], 1e-12)  # the clipped token too
    assert metrics["clip_frac_high"].item() == 0.5 and metrics["clip_frac_low"].item() == 0.0

    logp.grad = None
    loss, metrics = pl.cispo(logp, old, adv, mask, eps_low=0.2, eps_high=0.5)  # now r = e^-1 is raised to 0.8
    loss.backward()
    close(logp.grad, [[-1.5, 0.8 / 2]], 1e-12)
    assert metrics["clip_frac_low"].item() == 0.5


def test_sapo_gate_value_and_gradient():
    # token 1 on-policy with A > 0 (τ 1): f = 2, gradient -A·f'(1)·r = -1, PPO's; token 2: r = e^0.5, A < 0, τ 1.05
    logp = leaf([[0.0, 0.5]])
    loss, metrics = pl.sapo(logp, t([[0.0, 0.0]]), t([[1.0, -1.0]]), t([[1, 1]]), tau_pos=1.0, tau_neg=1.05,
                            agg="token_mean")  # fmt: skip
    r = math.exp(0.5)
    sig = 1 / (1 + math.exp(-1.05 * (r - 1)))
    assert loss.item() == pytest.approx((-2.0 + sig * 4 / 1.05) / 2, abs=1e-12)
    loss.backward()
    close(logp.grad, [[-1.0 / 2, 4 * sig * (1 - sig) * r / 2]], 1e-12)
    assert metrics["gate_slope_mean"].item() == pytest.approx((1.0 + 4 * sig * (1 - sig)) / 2)


def test_geo_mean_clips_in_log_space_by_the_sign_of_the_advantage():
    # row 0, A = +1: log r 0.5 capped at 0.4; row 1, A = -1: log r -0.6 floored at -0.4; row 2 has no real token
    logp = leaf([[0.5, -0.1, 0.2], [-0.6, 0.1, 9.0], [1.0, 1.0, 1.0]])
    old = torch.zeros(3, 3, dtype=torch.float64)
    adv = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    loss, metrics = pl.geo_mean(logp, old, adv, mask, eps_low=0.4, eps_high=0.4)
    rho0, rho1 = math.exp((0.4 - 0.1 + 0.2) / 3), math.exp((-0.4 + 0.1) / 2)
    assert loss.item() == pytest.approx((-rho0 + rho1) / 2, abs=1e-12)
    loss.backward()
    expected = [[0.0, -rho0 / 3 / 2, -rho0 / 3 / 2], [0.0, rho1 / 2 / 2, 0.0], [0.0, 0.0, 0.0]]
    close(logp.grad, expected, 1e-12)
    assert metrics["clip_frac_high"].item() == pytest.approx(0.2) and metrics["clip_frac_low"].item() == pytest.approx(
        0.2
    )


def test_rollout_weights_multiply_each_tokens_term_and_enter_gmpo_as_a_geometric_mean():
    logp, old, adv, mask = leaf([[0.1, -0.2]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 1]])
    weights = t([[2.0, 0.5]])
    plain, _ = pl.ppo_clip(logp, old, adv, mask, eps_low=0.3, eps_high=0.3)
    weighted, _ = pl.ppo_clip(logp, old, adv, mask, eps_low=0.3, eps_high=0.3, weights=weights)
    assert weighted.item() == pytest.approx((-2.0 * math.exp(0.1) - 0.5 * math.exp(-0.2)) / 2, abs=1e-12)
    assert plain.item() == pytest.approx((-math.exp(0.1) - math.exp(-0.2)) / 2, abs=1e-12)
    for loss_fn in (pl.gspo, pl.cispo, pl.sapo, pl.clip_cov, pl.kl_cov):
        unit, _ = loss_fn(logp, old, adv, mask, weights=torch.ones_like(weights))
        none, _ = loss_fn(logp, old, adv, mask)
        assert unit.item() == pytest.approx(none.item(), abs=1e-12), loss_fn.__name__
    gm, _ = pl.geo_mean(logp, old, adv, mask, weights=weights)  # geometric mean of 2 and 0.5 is 1
    assert gm.item() == pytest.approx(-math.exp(-0.05), abs=1e-9)
