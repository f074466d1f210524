"""One name, one meaning: every policy loss gets the same tensors, and each metric it shares with another is checked
against the definition docs/metrics.md writes for it, computed here independently (by hand, or from the loss's own
per-token gradients, the quantity a clip fraction counts)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import undocumented_metrics

from components import registry

# Five rows of three tokens, one ratio a row (so a sequence ratio is its tokens' ratio): r = 2 with A > 0 and with
# A < 0, r = 0.5 with A < 0, r = 1.1 with A > 0 (inside every bound), r = 2 with A = 0; row 3 has one padding token.
RATIOS = torch.tensor([2.0, 2.0, 0.5, 1.1, 2.0])
ROW_ADVANTAGES = torch.tensor([1.0, -1.0, -0.5, 2.0, 0.0])
MASK = torch.ones(5, 3)
MASK[3, 2] = 0.0
OLD_LOGP = torch.tensor([[-1.0, -2.0, -0.5]]).expand(5, 3).clone()
EPS = 0.2
# each loss's bounds at EPS, and without its upper / lower bound (GMPO's are in log space; CISPO's lower is None);
# Clip-Cov's covariance rule off, so that only the clip changes a gradient
BOUNDS = {
    "ppo_clip": ({"eps_low": EPS, "eps_high": EPS}, {"eps_high": 1e6}, {"eps_low": 1.0}),
    "clip_cov": ({"eps_low": EPS, "eps_high": EPS, "clip_cov_ub": -1e9}, {"eps_high": 1e6}, {"eps_low": 1.0}),
    "gspo": ({"eps_low": EPS, "eps_high": EPS}, {"eps_high": 1e6}, {"eps_low": 1.0}),
    "cispo": ({"eps_low": EPS, "eps_high": EPS}, {"eps_high": 1e6}, {"eps_low": None}),
    "geo_mean": ({"eps_low": EPS, "eps_high": EPS}, {"eps_high": 1e6}, {"eps_low": 1e6}),
}
LOSSES = [name for name in registry.names("policy_loss") if name != "none"]


def inputs(row_advantages=ROW_ADVANTAGES):
    logp = (OLD_LOGP + RATIOS.log()[:, None]).requires_grad_(True)
    return logp, OLD_LOGP, row_advantages[:, None].expand(5, 3).clone(), MASK


def run(name: str, row_advantages=ROW_ADVANTAGES, **hparams):
    """(loss, metrics, d loss / d logp [5, 3]) of policy loss ``name`` on the shared tensors."""
    logp, old, advantages, mask = inputs(row_advantages)
    torch.manual_seed(0)  # Clip-Cov's random pick
    loss, metrics = registry.get("policy_loss", name)(logp, old, advantages, mask, **hparams)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, {k: float(v) for k, v in metrics.items()}, grad


def changed_share(a: torch.Tensor, b: torch.Tensor) -> float:
    """The share of the real tokens whose gradient differs between ``a`` and ``b``."""
    real = MASK.bool()
    return float(((a - b).abs() > 1e-9)[real].float().mean())


REAL = MASK.bool()
LOG_R = torch.log(RATIOS)[:, None].expand(5, 3)


@pytest.mark.parametrize("name", LOSSES)
def test_the_token_ratio_metrics_mean_the_same_in_every_loss(name):
    _, metrics, _ = run(name, **BOUNDS.get(name, ({},))[0])
    assert metrics["approx_kl"] == pytest.approx(float((-LOG_R)[REAL].mean()))
    assert metrics["ratio_mean"] == pytest.approx(float(RATIOS[:, None].expand(5, 3)[REAL].mean()))
    assert metrics["ratio_max"] == pytest.approx(2.0)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_clip_fraction_is_the_share_of_tokens_whose_gradient_its_bound_changed(name):
    bounds, no_high, no_low = BOUNDS[name]
    _, metrics, grad = run(name, **bounds)
    _, _, grad_no_high = run(name, **{**bounds, **no_high})
    _, _, grad_no_low = run(name, **{**bounds, **no_low})
    assert metrics["clip_frac_high"] == pytest.approx(changed_share(grad, grad_no_high))
    assert metrics["clip_frac_low"] == pytest.approx(changed_share(grad, grad_no_low))
    assert metrics["clip_frac_high"] > 0 and metrics["clip_frac_low"] > 0  # the tensors exercise both bounds


def test_the_issues_example_ppo_counts_a_positive_half_cispo_both_signs():
    """Ratio 2 everywhere, half the rows A < 0: PPO's min leaves the A < 0 tokens' gradient alone, CISPO's capped
    weight changes both; one definition, two values."""
    logp = (torch.zeros(4, 2) + math.log(2.0)).requires_grad_(True)
    advantages = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]]).expand(4, 2)
    for name, want in (("ppo_clip", 0.5), ("gspo", 0.5), ("geo_mean", 0.5), ("cispo", 1.0)):
        hparams = {"eps_low": EPS, "eps_high": EPS} | ({"agg": "seq_mean_token_mean"} if name != "geo_mean" else {})
        _, metrics = registry.get("policy_loss", name)(logp, torch.zeros(4, 2), advantages, torch.ones(4, 2), **hparams)
        assert float(metrics["clip_frac_high"]) == pytest.approx(want), name


def test_the_sequence_ratio_is_the_geometric_mean_of_the_token_ratios_in_gspo_and_gmpo():
    for name in ("gspo", "geo_mean"):
        _, metrics, _ = run(name, **BOUNDS[name][0])
        assert metrics["seq_ratio_mean"] == pytest.approx(float(RATIOS.mean())), name  # one ratio a row
        assert metrics["seq_ratio_max"] == pytest.approx(2.0), name


def test_sapos_gate_slope_is_the_share_of_the_unclipped_gradient_each_token_keeps():
    _, metrics, grad = run("sapo", agg="token_mean")
    logp, old, advantages, mask = inputs()
    plain = -(advantages * torch.exp(logp - old))[REAL].mean()  # the unclipped policy gradient, token mean
    (plain_grad,) = torch.autograd.grad(plain, logp)
    kept = (grad / plain_grad)[REAL & (advantages != 0)]  # tokens with a gradient to keep a share of
    # a token without advantage counts its gate's slope at its ratio (τ_neg), as if it had a small negative one
    gate = torch.sigmoid(1.05 * (RATIOS[4] - 1.0))
    slopes = torch.cat([kept, (4 * gate * (1 - gate)).expand(3)])
    assert metrics["gate_slope_mean"] == pytest.approx(float(slopes.mean()), rel=1e-5)
    assert metrics["gate_slope_low_frac"] == pytest.approx(float((kept < 0.5).sum() / REAL.sum()))


@pytest.mark.parametrize(("name", "off"), [("clip_cov", {"clip_cov_ub": -1e9}), ("kl_cov", {"kl_coef": 0.0})])
def test_cov_frac_is_the_share_of_tokens_the_covariance_rule_acted_on(name, off):
    on = {"clip_cov_lb": -1e9, "clip_cov_ratio": 0.3} if name == "clip_cov" else {"kl_cov_ratio": 0.3}
    every_row = ROW_ADVANTAGES.where(ROW_ADVANTAGES != 0, 0.7)  # a selected token without advantage changes nothing
    _, metrics, grad = run(name, every_row, **on)
    _, _, grad_off = run(name, every_row, **{**on, **off})
    assert metrics["cov_frac"] == pytest.approx(changed_share(grad, grad_off))
    assert metrics["cov_frac"] > 0


def test_every_metric_a_policy_loss_or_a_correction_logs_is_in_the_table():
    for name in LOSSES:
        _, metrics, _ = run(name, **BOUNDS.get(name, ({},))[0])
        assert not undocumented_metrics([f"train/{k}" for k in metrics]), name
    for name in ("tis", "mis"):
        _, metrics = registry.get("rollout_correction", name)(OLD_LOGP, OLD_LOGP - 0.1, MASK)
        assert not undocumented_metrics([f"train/rollout_is_{k}" for k in metrics]), name
    assert undocumented_metrics(["train/gate_mean", "eval/pass_at_4"]) == ["train/gate_mean"]  # the check can fail
