"""The objective of one micro-batch as ``objective.micro_objective`` composes it, against numbers computed by hand;
and the rows that may skip their backward, derived from the same terms."""

from __future__ import annotations

import pytest
import torch

from rlx_cli.config.compose import compose
from rlx_cli.config.errors import UserError
from rlx_cli.config.validate import validate
from rlx_cli.loops import objective
from rlx_cli.loops.build import components_of
from rlx_cli.loops.objective import Shares, forward_only_rows, micro_objective

# 2 rows, 5 real tokens (row 1 has 2); on-policy (ratio 1), so PPO's per-token loss is −A
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADVANTAGES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
ENTROPY = torch.tensor([[0.1, 0.9, 0.2], [0.8, 0.3, 5.0]])  # padding's 5.0 must never be picked


def loss_of(overrides: list[str]) -> tuple[float, dict]:
    cfg = compose(["algo=grpo", *overrides])
    logp = torch.zeros_like(MASK, requires_grad=True)
    t = {"logp": logp, "old_logp": logp.detach(), "advantages": ADVANTAGES, "mask": MASK, "ref_logp": None,
         "positive": torch.tensor([True, False]), "entropy": ENTROPY}  # fmt: skip
    loss, metrics = micro_objective(cfg, components_of(cfg), t, Shares(loss=1.0, positive=1.0), "token_mean")
    return loss.item(), metrics


def test_every_real_token_without_a_filter():
    loss, metrics = loss_of(["loss_agg.mode=token_mean"])
    assert loss == pytest.approx(-(1 + 2 + 3 + 4 + 5) / 5)
    assert "train/selected_frac" not in metrics


def test_the_top_entropy_tokens_carry_the_gradient_divided_as_configured():
    # top_ratio 0.4 of 5 real tokens: k = ⌈2⌉ = 2, the entropies 0.9 (A 2) and 0.8 (A 4)
    selected, metrics = loss_of(["token_filter=high_entropy", "token_filter.top_ratio=0.4"])
    assert selected == pytest.approx(-(2 + 4) / 2)  # the authors' code: divided by the selected tokens
    assert metrics["train/selected_frac"] == pytest.approx(0.4)
    assert metrics["train/selected_entropy"] == pytest.approx((0.9 + 0.8) / 2)
    every, _ = loss_of(["token_filter=high_entropy", "token_filter.top_ratio=0.4", "token_filter.normalizer=all"])
    assert every == pytest.approx(-(2 + 4) / 5)  # TRL: divided by every real token


def test_a_normaliser_over_every_token_needs_a_mode_that_can_divide_by_it():
    cfg = compose(["token_filter=high_entropy", "token_filter.normalizer=all", "loss_agg.mode=seq_mean_token_mean"])
    with pytest.raises(UserError, match="token_filter.normalizer=all .*loss_agg.mode=seq_mean_token_mean"):
        validate(cfg)


def test_the_entropy_bonus_and_the_lm_loss_are_added_with_their_shares():
    # on-policy PPO: −A per token, token mean −3; entropy token mean (0.1+0.9+0.2+0.8+0.3)/5 = 0.46;
    # LM loss on the positive row 0: −logp = 0 per token; with logp 0 it adds 0
    loss, metrics = loss_of(["policy_loss.entropy_coef=0.5"])
    assert loss == pytest.approx(-3.0 - 0.5 * 0.46)
    assert metrics["train/entropy"] == pytest.approx(0.46)


ZERO_ROW = torch.tensor([[0.0, 0.0, 0.0], [4.0, 5.0, 0.0]])


def test_a_term_that_trains_rows_whatever_their_advantage_turns_the_skip_off(monkeypatch):
    """A new term added to the objective's one list is counted by both the loss and the skip's predicate."""
    cfg = compose(["algo=grpo"])
    comp = components_of(cfg)
    assert forward_only_rows(cfg, comp, ZERO_ROW, MASK).tolist() == [True, False]
    bonus = objective.Term(
        "a length bonus", on=lambda cfg, comp: True, spares_rows_without_advantage=objective.never,
        value=lambda comp, t, shares, agg: (shares.loss * -(t["logp"] * t["mask"]).sum(), {"train/bonus": 1.0}),
    )  # fmt: skip
    monkeypatch.setattr(objective, "TERMS", [*objective.TERMS, bonus])
    assert forward_only_rows(cfg, comp, ZERO_ROW, MASK) is None  # row 0 now has a gradient: it must run backward
    logp = torch.full_like(MASK, -1.0, requires_grad=True)
    t = {"logp": logp, "old_logp": logp.detach(), "advantages": ZERO_ROW, "mask": MASK, "ref_logp": None,
         "positive": torch.tensor([False, False]), "entropy": ENTROPY}  # fmt: skip
    loss, metrics = micro_objective(cfg, comp, t, Shares(loss=1.0, positive=0.0), "token_mean")
    assert metrics["train/bonus"] == 1.0
    assert loss.item() == pytest.approx(-(4 + 5) / 5 + 5.0)  # PPO's −A token mean plus the bonus's −Σlogp
    loss.backward()
    assert logp.grad[0].abs().sum() > 0  # the zero-advantage row gets a gradient from the new term
