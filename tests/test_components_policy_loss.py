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
    # clip-higher let no token through: t0's 1.1 is under 1 + ε_low, t1's 1.5 over 1 + ε_high
    assert metrics["clip_higher_share"].item() == 0.0
    assert set(metrics) == {"clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean", "ratio_max", "dual_clip_frac",
                            "clip_higher_share"}  # fmt: skip
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


# Clip-Cov and KL-Cov: two rows, the second with two padded tokens (garbage that must not matter). A and ℓ = logp are
# chosen so that Ā = 0 and ℓ̄ = −2 over the six real tokens:
#   A     = [3, 1, -1, -2.5 | 2, -2.5]          ℓ − ℓ̄ = [1, 0, -1, -2 | 1.5, 0.5]
#   Cov_i = [3, 0,  1,  5   | 3, -1.25]         mean Cov = 10.75 / 6
COV_ADV = torch.tensor([[3.0, 1.0, -1.0, -2.5], [2.0, -2.5, 100.0, -100.0]])
COV_LOGP = [[-1.0, -2.0, -3.0, -4.0], [-0.5, -1.5, 50.0, math.nan]]
COV_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])


def cov_inputs(ratios):
    """logp = ℓ (requires grad) and old_logp = ℓ − log r, for ratios [[4], [2]] over the real tokens."""
    logp = torch.tensor(COV_LOGP, requires_grad=True)
    log_r = torch.tensor([[math.log(r) for r in ratios[0]], [math.log(r) for r in ratios[1]] + [0.0, 0.0]])
    return logp, (logp.detach() - log_r).nan_to_num(0.0)


# Clip-Cov ratios: row 1's first token (A = 2, r = 1.5 > 1.2) is clipped by PPO although its Cov = 3 is in (1, 5)
CLIP_RATIOS = [[1.1, 1.0, 0.9, 1.0], [1.5, 1.0]]


def test_clip_cov_by_hand():
    logp, old = cov_inputs(CLIP_RATIOS)
    loss, metrics = policy_loss.clip_cov(logp, old, COV_ADV, COV_MASK)
    # candidates, 1 < Cov < 5 strictly and not PPO-clipped: only t0 (Cov 3). Cov 1 (t2) and 5 (t3) sit on the
    # bounds; row 1's t0 (Cov 3) is already clipped. max(⌊2e-4·6⌋, 1) = 1 token is picked: t0, the only candidate.
    # per token: t0 -3.3 -> 0 (picked), t1 -1, t2 max(0.9, 0.9) = 0.9, t3 2.5, row 1: max(-3, -2.4) = -2.4, 2.5
    # token_mean: (0 - 1 + 0.9 + 2.5 - 2.4 + 2.5) / 6 — the picked token stays in the denominator
    assert loss.item() == pytest.approx(2.5 / 6, abs=1e-6)
    assert metrics["cov_frac"].item() == pytest.approx(1 / 6)
    assert metrics["cov_candidate_frac"].item() == pytest.approx(1 / 6)
    assert metrics["cov_mean"].item() == pytest.approx(10.75 / 6, abs=1e-6)
    assert metrics["clip_frac_high"].item() == pytest.approx(1 / 6) and metrics["clip_frac_low"].item() == 0.0
    assert metrics["ratio_mean"].item() == pytest.approx(6.5 / 6, abs=1e-6)  # (1.1+1+0.9+1+1.5+1)/6
    assert metrics["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)
    assert metrics["approx_kl"].item() == pytest.approx(-math.log(1.1 * 0.9 * 1.5) / 6, abs=1e-6)
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    loss.backward()
    # d/dlogp: -A·r / 6 on unclipped, unpicked tokens; 0 on t0 (picked), row 1's t0 (clipped) and padding
    expected = torch.tensor([[0.0, -1.0, 0.9, 2.5], [0.0, 2.5, 0.0, 0.0]]) / 6
    assert torch.allclose(logp.grad, expected, atol=1e-6)


@pytest.mark.parametrize(
    ("lb", "ub", "candidates"),
    [
        (1.0, 5.0, 1),  # t0 only
        (0.999, 5.0, 2),  # t2 (Cov exactly 1) enters once the lower bound is below it
        (1.0, 5.001, 2),  # t3 (Cov exactly 5) enters once the upper bound is above it
        (-10.0, 10.0, 5),  # every real token but row 1's t0, which PPO clipped
    ],
)
def test_clip_cov_window_is_strict_and_skips_ppo_clipped(lb, ub, candidates):
    logp, old = cov_inputs(CLIP_RATIOS)
    _, metrics = policy_loss.clip_cov(logp, old, COV_ADV, COV_MASK, clip_cov_lb=lb, clip_cov_ub=ub)
    assert metrics["cov_candidate_frac"].item() * 6 == pytest.approx(candidates)
    assert metrics["cov_frac"].item() * 6 == pytest.approx(1)  # max(⌊2e-4·6⌋, 1)


def many_candidates():
    """4 rows x 50, 180 real tokens (row 3 has 30), on-policy; with the window (-1e9, 1e9) every real token is a
    candidate and its gradient is -A/180 unless it is picked (then 0)."""
    generator = torch.Generator().manual_seed(123)
    adv = torch.randn(4, 50, generator=generator).sign()  # ±1, never 0
    mask = torch.ones(4, 50)
    mask[3, 30:] = 0
    logp = (-torch.rand(4, 50, generator=generator)).requires_grad_(True)
    return logp, adv, mask


def clip_cov_pick(ratio: float, seed: int | None = None) -> torch.Tensor:
    logp, adv, mask = many_candidates()
    if seed is not None:
        torch.manual_seed(seed)
    loss, metrics = policy_loss.clip_cov(
        logp, logp.detach(), adv, mask, clip_cov_ratio=ratio, clip_cov_lb=-1e9, clip_cov_ub=1e9
    )
    loss.backward()
    picked = (logp.grad == 0) & (mask > 0)
    assert metrics["cov_frac"].item() * 180 == pytest.approx(picked.sum().item())
    assert torch.allclose(logp.grad[~picked & (mask > 0)], -adv[~picked & (mask > 0)] / 180)
    return picked


@pytest.mark.parametrize(("ratio", "count"), [(0.1, 18), (0.05, 9), (1e-4, 1), (1.0, 180)])
def test_clip_cov_picks_floor_ratio_n_at_least_one(ratio, count):
    assert clip_cov_pick(ratio, seed=0).sum().item() == count  # ⌊0.1·180⌋ = 18, ⌊0.018⌋ -> 1, all 180


def test_clip_cov_pick_follows_the_global_seed():
    first, again, other = clip_cov_pick(0.1, seed=7), clip_cov_pick(0.1, seed=7), clip_cov_pick(0.1, seed=8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)  # 18 of 180: another seed picks another subset


def test_random_subset_takes_every_candidate_when_there_are_few_and_draws_nothing_without():
    candidates = torch.tensor([[False, True, False], [True, False, False]])
    assert torch.equal(policy_loss.random_subset(candidates, 5), candidates)
    state = torch.get_rng_state()
    assert not policy_loss.random_subset(torch.zeros(2, 3, dtype=torch.bool), 1).any()
    assert torch.equal(torch.get_rng_state(), state)  # no candidate: the global stream is untouched


def test_clip_cov_empty_mask_is_finite():
    zeros = torch.zeros(2, 3)
    loss, metrics = policy_loss.clip_cov(zeros, zeros, torch.ones(2, 3), zeros)
    assert loss.item() == 0.0 and metrics["cov_frac"].item() == 0.0 and metrics["ratio_max"].item() == 0.0


# KL-Cov ratios: t3 (the largest Cov, 5) has r = 0.5, so its penalty |log 0.5| is not 0
KL_RATIOS = [[1.1, 1.0, 0.9, 0.5], [1.5, 1.0]]


def test_kl_cov_by_hand_top_tokens_and_tie():
    logp, old = cov_inputs(KL_RATIOS)
    loss, metrics = policy_loss.kl_cov(logp, old, COV_ADV, COV_MASK, kl_cov_ratio=0.34, kl_coef=1.0)
    # k = ⌊0.34·6⌋ = 2: Cov 5 (t3), then Cov 3 — a tie between row 0's t0 and row 1's t0; the earlier (row 0) wins.
    # per token -A·r (no clipping): -3.3, -1, 0.9, 1.25 | -3, 2.5; plus |log r| on t0 (log 1.1) and t3 (log 2)
    penalties = math.log(1.1) + math.log(2.0)
    assert loss.item() == pytest.approx((-3.3 - 1 + 0.9 + 1.25 - 3 + 2.5 + penalties) / 6, abs=1e-6)
    assert metrics["cov_frac"].item() == pytest.approx(2 / 6)
    assert metrics["cov_mean"].item() == pytest.approx(10.75 / 6, abs=1e-6)
    abs_kl = math.log(1.1) - math.log(0.9) + math.log(2.0) + math.log(1.5)
    assert metrics["abs_kl"].item() == pytest.approx(abs_kl / 6, abs=1e-6)
    assert metrics["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)
    assert set(metrics) == {"cov_frac", "cov_mean", "abs_kl", "approx_kl", "ratio_mean", "ratio_max"}
    loss.backward()
    # d/dlogp: -A·r everywhere (no clip) + β·sign(logp - old_logp) on t0 (+1) and t3 (-1); /6
    expected = torch.tensor([[-3.3 + 1.0, -1.0, 0.9, 1.25 - 1.0], [-3.0, 2.5, 0.0, 0.0]]) / 6
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_kl_cov_default_ratio_takes_one_token_the_largest_cov():
    logp, old = cov_inputs(KL_RATIOS)
    loss, metrics = policy_loss.kl_cov(logp, old, COV_ADV, COV_MASK)  # ⌊2e-3·6⌋ = 0 -> max(1, 0) = 1: t3 only
    assert metrics["cov_frac"].item() == pytest.approx(1 / 6)
    assert loss.item() == pytest.approx((-3.3 - 1 + 0.9 + 1.25 - 3 + 2.5 + math.log(2.0)) / 6, abs=1e-6)


def test_kl_cov_on_policy_penalty_and_its_gradient_are_zero():
    logp = torch.tensor(COV_LOGP, requires_grad=True)
    loss, metrics = policy_loss.kl_cov(logp, logp.detach(), COV_ADV, COV_MASK, kl_cov_ratio=1.0, kl_coef=5.0)
    # every real token is penalised, by 5·|0| = 0: the loss is -mean(A) = 0 and the gradient -A/6
    assert loss.item() == pytest.approx(0.0, abs=1e-7) and metrics["cov_frac"].item() == pytest.approx(1.0)
    assert metrics["abs_kl"].item() == 0.0
    loss.backward()
    assert torch.allclose(logp.grad, torch.where(COV_MASK > 0, -COV_ADV / 6, 0.0), atol=1e-7)
