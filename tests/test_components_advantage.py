"""Advantage estimators on hand-computed tensors (arithmetic in the comments)."""

import math

import numpy as np
import pytest
import torch

from components import advantage

# one response of 3 tokens: score 1 on the last token, values V = [0.5, 0.25, 0.75]
R = torch.tensor([[0.0, 0.0, 1.0]])
V = torch.tensor([[0.5, 0.25, 0.75]])
M = torch.ones(1, 3)


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol)


# ---------------------------------------------------------------- token_rewards, whiten, explained variance


def test_token_rewards_score_on_last_real_token_minus_kl():
    scores = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert close(advantage.token_rewards(scores, mask), [[0, 1, 0], [0, 0, 2], [0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.1, 0.1, 0.1], [5.0, 5.0, 5.0]])
    # row 0: [-0.1, 1 - 0.2, pad]; row 1: [-0.1, -0.1, 2 - 0.1]; row 2 has no tokens
    assert close(advantage.token_rewards(scores, mask, kl), [[-0.1, 0.8, 0], [-0.1, -0.1, 1.9], [0, 0, 0]])


def test_whiten_and_clip():
    adv = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # mean 2, unbiased var (1+0+1)/2 = 1 -> [-1, 0, 1]
    assert close(advantage.whiten_and_clip(adv, mask), [[-1, 0, 1, 0]], tol=1e-4)
    assert close(advantage.whiten_and_clip(adv, mask, clip=0.5), [[-0.5, 0, 0.5, 0]], tol=1e-4)
    assert close(advantage.whiten_and_clip(adv, mask, whiten=False, clip=1.5), [[1, 1.5, 1.5, 0]])


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert advantage.explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    # R - V = [0, 0, 1]: biased var 2/9; Var(R) = 2/3 -> 1 - (2/9)/(2/3) = 2/3
    values = torch.tensor([[1.0, 2.0, 2.0, -7.0]])
    assert advantage.explained_variance(values, returns, mask).item() == pytest.approx(2 / 3)
    assert advantage.explained_variance(values, torch.ones(1, 4), mask).item() == 0.0  # Var(R) = 0
    # R = 1 up to GAE's rounding (a minibatch whose answers all scored 1): constant, not 1 − 1e-2 / 1e-14
    rounded = torch.tensor([[1.0, 1.0 + 1.2e-7, 1.0 - 1.2e-7, 0.0]])
    assert advantage.explained_variance(torch.tensor([[0.9, 0.5, 0.7, 0.0]]), rounded, mask).item() == 0.0
    small = torch.tensor([[1e-3, 2e-3, 3e-3, 0.0]])  # a small but real spread is still explained
    assert advantage.explained_variance(small, small, mask).item() == pytest.approx(1.0)


# ---------------------------------------------------------------- gae


def test_gae_lambda_one_is_monte_carlo():
    adv, ret = advantage.gae(R, V, M, gamma=1.0, lam=1.0)
    # G = [1, 1, 1]; A = G - V = [0.5, 0.75, 0.25]; returns = A + V = G
    assert close(adv, [[0.5, 0.75, 0.25]])
    assert close(ret, [[1.0, 1.0, 1.0]])


def test_gae_lambda_zero_is_td_error():
    adv, ret = advantage.gae(R, V, M, gamma=1.0, lam=0.0)
    # δ0 = 0 + 0.25 - 0.5 = -0.25; δ1 = 0 + 0.75 - 0.25 = 0.5; δ2 = 1 + 0 - 0.75 = 0.25 (no bootstrap)
    assert close(adv, [[-0.25, 0.5, 0.25]])
    assert close(ret, [[0.25, 0.75, 1.0]])


def test_gae_gamma_and_lambda_below_one():
    adv, _ = advantage.gae(R, V, M, gamma=0.5, lam=0.5)
    # δ0 = 0 + 0.5·0.25 - 0.5 = -0.375; δ1 = 0 + 0.5·0.75 - 0.25 = 0.125; δ2 = 1 - 0.75 = 0.25
    # A2 = 0.25; A1 = 0.125 + 0.25·0.25 = 0.1875; A0 = -0.375 + 0.25·0.1875 = -0.328125
    assert close(adv, [[-0.328125, 0.1875, 0.25]])


def test_gae_per_row_lambda():
    rewards, values, mask = R.repeat(2, 1), V.repeat(2, 1), M.repeat(2, 1)
    adv, ret = advantage.gae(rewards, values, mask, lam=torch.tensor([1.0, 0.0]))
    assert close(adv, [[0.5, 0.75, 0.25], [-0.25, 0.5, 0.25]])
    assert close(ret, [[1.0, 1.0, 1.0], [0.25, 0.75, 1.0]])
    same, _ = advantage.gae(rewards, values, mask, lam=torch.tensor([0.7, 0.7]))
    assert close(same, advantage.gae(rewards, values, mask, lam=0.7)[0])


def test_gae_no_bootstrap_past_last_real_token():
    # row ends at t = 1; the value 100 at the padded t = 2 must not be bootstrapped
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv, ret = advantage.gae(rewards, values, mask, lam=0.0)
    # δ1 = 1 + 0 - 0.25 = 0.75; δ0 = 0 + 0.25 - 0.5 = -0.25
    assert close(adv, [[-0.25, 0.75, 0.0]])
    assert close(ret, [[0.25, 1.0, 0.0]])


@pytest.mark.parametrize("lam", [0.0, 0.9, 1.0])
def test_gae_padding_invariance(lam):
    rewards = torch.tensor([[0.0, 0.2, 1.0], [0.3, -1.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.6], [0.1, 0.2, 0.3]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = advantage.gae(rewards, values, mask, gamma=0.9, lam=lam)
    garbage = torch.tensor([[7.0, math.nan], [math.inf, -3.0]])
    adv_p, ret_p = advantage.gae(
        torch.cat([rewards, garbage], -1),
        torch.cat([values, garbage], -1),
        torch.cat([mask, torch.zeros(2, 2)], -1),
        gamma=0.9,
        lam=lam,
    )
    assert close(adv_p[:, :3], adv) and close(ret_p[:, :3], ret)
    assert (adv_p[:, 3:] == 0).all() and (ret_p[:, 3:] == 0).all()
    assert (adv[1, 2] == 0) and (ret[1, 2] == 0)


# ---------------------------------------------------------------- grpo, rloo

SCORES = torch.tensor([1.0, 0.0, 1.0, 5.0, 2.0, 2.0])
GROUPS = torch.tensor([7, 7, 7, 3, 9, 9])  # a group of 3, a singleton, an all-equal pair
MASK6 = torch.tensor([[1.0, 1.0]] * 5 + [[1.0, 0.0]])


def test_grpo_by_hand():
    adv = advantage.grpo(SCORES, GROUPS, MASK6)
    # group 7: mean 2/3, unbiased std sqrt(((1/3)² + (2/3)² + (1/3)²)/2) = sqrt(1/3) = 0.57735
    std = math.sqrt(1 / 3) + 1e-6
    expected = [(1 / 3) / std, (-2 / 3) / std, (1 / 3) / std, 5.0, 0.0, 0.0]  # singleton raw, equal -> 0
    assert close(adv[:, 0], expected, tol=1e-5)
    assert close(adv[:, 1], expected[:5] + [0.0], tol=1e-5)  # same value on every real token, 0 on padding


def test_grpo_without_std_is_dr_grpo():
    adv = advantage.grpo(SCORES, GROUPS, MASK6, norm_by_std=False)
    assert close(adv[:, 0], [1 / 3, -2 / 3, 1 / 3, 5.0, 0.0, 0.0])


def test_grpo_accepts_integer_scores():
    adv = advantage.grpo(torch.tensor([1, 0]), torch.tensor([0, 0]), torch.ones(2, 1))
    # mean 0.5, std sqrt(0.5) -> ±0.5/0.70711
    assert close(adv[:, 0], [0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)], tol=1e-5)


def test_rloo_by_hand():
    adv = advantage.rloo(SCORES, GROUPS, MASK6)
    # group 7: 1 - mean(0, 1) = 0.5; 0 - mean(1, 1) = -1; equal pair -> 0; singleton raw
    assert close(adv[:, 0], [0.5, -1.0, 0.5, 5.0, 0.0, 0.0])
    assert adv[5, 1] == 0


# ---------------------------------------------------------------- reinforce++


def _np_whiten(x, m):
    values = x[m]
    return np.where(m, (x - values.mean()) / np.sqrt(values.var(ddof=1) + 1e-8), 0.0)


def _np_returns(r, m, gamma):
    out = np.zeros_like(r)
    for b in range(r.shape[0]):
        running = 0.0
        for t in reversed(range(r.shape[1])):
            if m[b, t]:
                running = r[b, t] + gamma * running
                out[b, t] = running
    return out


def test_reinforce_pp_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # returns (γ=1): [1, 1, 1] and [2, 2]; mean 7/5 = 1.4; unbiased var (3·0.16 + 2·0.36)/4 = 0.3
    s = math.sqrt(0.3 + 1e-8)
    assert close(advantage.reinforce_pp(rewards, mask), [[-0.4 / s] * 3, [0.6 / s, 0.6 / s, 0.0]], tol=1e-5)


def test_reinforce_pp_against_numpy_with_gamma():
    gen = np.random.default_rng(0)
    r = gen.normal(size=(4, 6))
    m = np.ones((4, 6), dtype=bool)
    m[1, 4:] = m[2, 2:] = m[3, 5:] = False
    expected = _np_whiten(_np_returns(r, m, 0.9), m)
    got = advantage.reinforce_pp(torch.tensor(r), torch.tensor(m), gamma=0.9)
    assert np.allclose(got.numpy(), expected)


def test_reinforce_pp_baseline_by_hand():
    rewards = torch.tensor([[0.0, -0.1, 1.0], [0.0, 0.5, 9.0], [0.0, 3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    groups = torch.tensor([0, 0, 1])
    # returns: [0.9, 0.9, 1.0], [0.5, 0.5], [3, 3]; group 0 mean of sequence returns (0.9 + 0.5)/2 = 0.7;
    # group 1 is a singleton (baseline 0) -> [0.2, 0.2, 0.3], [-0.2, -0.2], [3, 3], then whitened
    centred = np.array([[0.2, 0.2, 0.3], [-0.2, -0.2, 0.0], [3.0, 3.0, 0.0]])
    expected = _np_whiten(centred, mask.bool().numpy())
    assert np.allclose(advantage.reinforce_pp_baseline(rewards, groups, mask).numpy(), expected, atol=1e-6)


def test_reinforce_pp_baseline_matches_openrlhf_when_kl_is_in_the_loss():
    # OpenRLHF reinforce_baseline: subtract the group mean of the scores, then returns, then whiten
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    group_mean = torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0, 1.0])
    expected = advantage.reinforce_pp(advantage.token_rewards(scores - group_mean, mask), mask)
    got = advantage.reinforce_pp_baseline(advantage.token_rewards(scores, mask), groups, mask)
    assert close(got, expected, tol=1e-5)
