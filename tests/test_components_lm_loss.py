"""lm_loss.positive_nll and lm_loss.none."""

import math

import pytest
import torch

from components import lm_loss

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def logp():
    return torch.tensor([[-1.0, -2.0, math.nan], [-3.0, -4.0, -5.0]], requires_grad=True)


def test_positive_rows_token_mean():
    assert lm_loss.positive_nll(logp(), MASK, torch.tensor([True, False])).item() == pytest.approx(1.5)  # (1+2)/2
    assert lm_loss.positive_nll(logp(), MASK, torch.tensor([True, True])).item() == pytest.approx(3.0)  # 15/5
    assert lm_loss.positive_nll(logp(), MASK, torch.tensor([False, True])).item() == pytest.approx(4.0)  # 12/3


def test_gradient_only_on_positive_real_tokens():
    lp = logp()
    lm_loss.positive_nll(lp, MASK, torch.tensor([True, False])).backward()
    assert torch.equal(lp.grad, torch.tensor([[-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("fn", [lm_loss.positive_nll, lm_loss.none])
def test_no_positive_is_a_zero_that_backpropagates(fn):
    lp = logp()
    out = fn(lp, MASK, torch.tensor([False, False]))
    assert out.dim() == 0 and out.item() == 0.0
    out.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 3))
