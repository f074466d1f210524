"""components/acted.py and loss_agg.row_weights on hand-built tensors: each ingredient's "did it act" figure."""

from __future__ import annotations

import math

import pytest
import torch

from components import acted
from components.loss_agg import MODES, aggregate, row_weights


def test_clip_higher_counts_the_tokens_the_higher_bound_let_through():
    # ε_low 0.2, ε_high 0.28: ratio 1.25 with A > 0 is let through; 1.3 is cut either way, 1.1 inside either way,
    # A < 0 is not clip-higher's business, the padding token is not counted
    ratio = torch.tensor([[1.25, 1.30, 1.10, 1.25], [1.21, 1.28, 1.0, 9.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0, -1.0], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    share = acted.clip_higher_share(ratio, advantages, mask, eps_low=0.2, eps_high=0.28)
    assert float(share) == pytest.approx(3 / 7)  # 1.25, 1.21 and 1.28 (the bound included) of 7 real tokens
    assert float(acted.clip_higher_share(ratio, advantages, mask, eps_low=0.2, eps_high=0.2)) == 0.0


def test_lam_range_of_a_length_adaptive_row():
    # λ = 1 - 1/(α·l) with α 0.05: lengths 40 and 400 give 0.5 and 0.95
    lam = 1 - 1 / (0.05 * torch.tensor([40.0, 400.0, 100.0]))
    assert acted.lam_range(lam) == (pytest.approx(0.5), pytest.approx(0.95))
    assert acted.lam_range(0.95) == (pytest.approx(0.95), pytest.approx(0.95))


def test_first_token_bias_against_the_monte_carlo_return():
    # a critic that says 0.8 at the first token of answers whose returns are 0 and 0.4 + 0.6 = 1: bias +0.3 on
    # average; the first row's padding token carries a reward that is no part of its return
    values = torch.tensor([[0.8, 0.5, 0.0], [0.8, 0.9, 0.0], [0.1, 0.0, 0.0]])
    token_rewards = torch.tensor([[0.0, 0.0, 5.0], [0.0, 0.4, 0.6], [9.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])  # the third row has no answer
    assert float(acted.first_token_bias(values, token_rewards, mask)) == pytest.approx(0.3)


@pytest.mark.parametrize("mode", MODES)
def test_row_weights_give_aggregate_as_a_weighted_sum_of_row_means(mode):
    torch.manual_seed(0)
    loss = torch.randn(5, 7, dtype=torch.float64)
    mask = torch.zeros(5, 7)
    for i, n in enumerate([7, 3, 1, 0, 5]):
        mask[i, :n] = 1
    row_means = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    weights = row_weights(mask, mode=mode).double()
    # the weights are float32 (each within 2^-24 of its value): five products summed, well inside 1e-6 relative
    assert float((weights * row_means).sum()) == pytest.approx(float(aggregate(loss, mask, mode=mode)), rel=1e-6)
    assert float(weights[3]) == 0.0


def test_the_longest_quarter_weighs_more_under_token_mean():
    # lengths 10, 20, 30, 300: the longest quarter is the one 300-token answer
    mask = torch.zeros(4, 300)
    for i, n in enumerate([10, 20, 30, 300]):
        mask[i, :n] = 1
    lengths = mask.sum(-1)
    token_mean = acted.longest_quarter_share(row_weights(mask, mode="token_mean"), lengths)
    seq_mean = acted.longest_quarter_share(row_weights(mask, mode="seq_mean_token_mean"), lengths)
    assert float(token_mean) == pytest.approx(300 / 360) and float(seq_mean) == pytest.approx(0.25)
    # 5 rows: the ⌈5/4⌉ = 2 longest
    assert float(acted.longest_quarter_share(torch.ones(5), torch.tensor([1, 5, 3, 5, 2]))) == pytest.approx(0.4)


def test_groups_with_a_positive_answer_and_prompts_an_update_sees():
    scores = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.5, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert float(acted.groups_with_positive(scores, groups)) == pytest.approx(2 / 3)
    minibatches = [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])]  # groups {0, 1} and {1, 2}
    assert acted.distinct_prompts(groups, minibatches) == 2.0
    assert acted.distinct_prompts(torch.arange(6), minibatches) == 3.0  # one answer a prompt: every row its own
    assert not math.isnan(acted.distinct_prompts(groups, []))


@pytest.mark.parametrize(("mode", "quarter"), [("token_mean", 0.4), ("seq_mean_token_mean", 0.25)])
def test_a_steps_acted_metrics_from_its_tensors(mode, quarter):
    """loops/loop.acted_metrics on a 4-row step, each figure by hand: lengths 3, 2, 1, 4 (token_mean weights 0.3,
    0.2, 0.1, 0.4; the longest quarter is the 4-token row); λ 0.9 .. 0.99; one of two groups has a positive answer;
    the first-token values 0.5, 0.2, 0.1, 0.3 against Monte-Carlo returns 1, 0, 0, 0: bias
    (−0.5 + 0.2 + 0.1 + 0.3) / 4."""
    from types import SimpleNamespace

    from components.advantage import token_rewards
    from rlx_cli.loops.loop import acted_metrics

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0])
    values = torch.tensor([[0.5, 0.7, 0.9, 0.0], [0.2, 0.1, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0], [0.3, 0.3, 0.2, 0.1]])
    t = {"mask": mask, "scores": scores, "group_index": torch.tensor([0, 0, 1, 1]), "values": values,
         "token_rewards": token_rewards(scores, mask, None)}  # fmt: skip
    comp = {"loss_agg": SimpleNamespace(hparams={"mode": mode})}
    metrics = acted_metrics(comp, t, torch.tensor([0.9, 0.95, 0.99, 0.97]))
    assert metrics["train/policy_lam_min"] == pytest.approx(0.9) and metrics["train/policy_lam_max"] == pytest.approx(
        0.99
    )
    assert metrics["train/groups_with_positive"] == 0.5
    assert metrics["train/long_quarter_weight"] == pytest.approx(quarter, abs=1e-6)
    assert metrics["train/critic_first_token_bias"] == pytest.approx(0.025, abs=1e-6)
    assert "train/critic_first_token_bias" not in acted_metrics(comp, {**t, "values": None}, torch.tensor(0.95))
