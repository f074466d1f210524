"""The loss of one micro-batch as ``update.micro_loss`` composes it, against numbers computed by hand."""

from __future__ import annotations

import pytest
import torch

from rlx_cli.config.compose import compose
from rlx_cli.config.errors import UserError
from rlx_cli.config.validate import validate
from rlx_cli.loops.build import components_of
from rlx_cli.loops.update import micro_loss

# 2 rows, 5 real tokens (row 1 has 2); on-policy (ratio 1), so PPO's per-token loss is −A
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADVANTAGES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
ENTROPY = torch.tensor([[0.1, 0.9, 0.2], [0.8, 0.3, 5.0]])  # padding's 5.0 must never be picked


def loss_of(overrides: list[str]) -> tuple[float, dict]:
    comp = components_of(compose(["algo=grpo", *overrides]))
    logp = torch.zeros_like(MASK, requires_grad=True)
    t = {"logp": logp, "old_logp": logp.detach(), "advantages": ADVANTAGES, "mask": MASK, "ref_logp": None,
         "positive": torch.tensor([True, False])}  # fmt: skip
    loss, metrics = micro_loss(comp, t, ENTROPY, "token_mean")
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
