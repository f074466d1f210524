"""TIS and MIS weights, per token and per sequence, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from components import rollout_correction as rc

# trainer log-probs, sampler log-probs: log w = 0.5 and -1.0 on the real tokens; row 1's third token is padding
LOGP = torch.tensor([[-1.0, -2.0, -3.0], [-0.2, -0.2, -0.2]])
ROLLOUT = torch.tensor([[-1.5, -1.0, 40.0], [-0.3, -0.1, -0.2]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
W = [math.exp(0.5), math.exp(-1.0), math.exp(0.1), math.exp(-0.1), 1.0]  # the real tokens' raw weights


def close(x, expected, tol):
    """``x`` equals the nested list ``expected`` to ``tol``, elementwise."""
    torch.testing.assert_close(x.double(), torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


def ess(ws):
    return sum(ws) ** 2 / (len(ws) * sum(w * w for w in ws))


def test_tis_token_truncates_each_weight_at_the_cap():
    weights, metrics = rc.tis(LOGP, ROLLOUT, MASK, level="token", cap=1.5)
    expected = [[1.5, W[1], 0.0], [W[2], W[3], 1.0]]
    close(weights, expected, 1e-6)
    assert metrics["truncated_frac"].item() == pytest.approx(1 / 5)
    assert metrics["weight_mean"].item() == pytest.approx((1.5 + sum(W[1:])) / 5, abs=1e-6)
    assert metrics["weight_max"].item() == pytest.approx(1.5)
    assert metrics["ess"].item() == pytest.approx(ess(W), abs=1e-6)  # of the weights before truncation


def test_tis_sequence_uses_the_product_over_each_row():
    weights, metrics = rc.tis(LOGP, ROLLOUT, MASK, level="sequence", cap=2.0)
    row0, row1 = math.exp(0.5 - 1.0), math.exp(0.1 - 0.1 + 0.0)
    close(weights, [[row0, row0, 0.0], [row1, row1, row1]], 1e-6)
    assert metrics["truncated_frac"].item() == 0.0
    weights, metrics = rc.tis(LOGP, ROLLOUT, MASK, level="sequence", cap=0.5)
    close(weights, [[0.5, 0.5, 0.0], [0.5, 0.5, 0.5]], 1e-6)  # both rows above the cap: e^-0.5 and 1
    assert metrics["truncated_frac"].item() == 1.0


def test_mis_token_zeroes_weights_outside_the_band():
    weights, metrics = rc.mis(LOGP, ROLLOUT, MASK, level="token", lower=0.5, upper=1.5)
    close(weights, [[0.0, 0.0, 0.0], [W[2], W[3], 1.0]], 1e-6)
    assert metrics["masked_frac"].item() == pytest.approx(2 / 5)
    assert metrics["weight_max"].item() == pytest.approx(W[2], abs=1e-6)


def test_mis_sequence_masks_whole_rows():
    weights, metrics = rc.mis(LOGP, ROLLOUT, MASK, level="sequence", lower=0.7, upper=2.0)
    close(weights, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], 1e-6)  # row 0: e^-0.5 < 0.7
    assert metrics["masked_frac"].item() == pytest.approx(2 / 5)


def test_weights_are_detached_clamped_and_one_on_an_equal_sampler():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    weights, metrics = rc.tis(logp, logp.detach(), torch.ones(1, 2), cap=2.0)
    assert not weights.requires_grad and weights.tolist() == [[1.0, 1.0]] and metrics["ess"].item() == 1.0
    far, _ = rc.mis(torch.tensor([[0.0]]), torch.tensor([[-100.0]]), torch.ones(1, 1), lower=0.0, upper=math.inf)
    assert far.item() == pytest.approx(math.exp(20.0), rel=1e-5)  # log w clamped at 20
    assert rc.none(logp, None, torch.ones(1, 2)) == (None, {})
