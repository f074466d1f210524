"""kl.estimate kinds by hand."""

import math

import pytest
import torch

from components import kl

LOGP = torch.tensor([[0.0, 0.0, -0.5]])
REF = torch.tensor([[1.0, -1.0, -0.5]])


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", [-1.0, 1.0, 0.0]),  # logp - ref
        ("abs", [1.0, 1.0, 0.0]),
        ("k2", [0.5, 0.5, 0.0]),  # ½·k1²
        # exp(ref - logp) - (ref - logp) - 1: e - 1 - 1 and e^-1 + 1 - 1
        ("k3", [math.e - 2.0, math.exp(-1.0), 0.0]),
    ],
)
def test_kinds_by_hand(kind, expected):
    assert torch.allclose(kl.estimate(LOGP, REF, kind=kind), torch.tensor([expected]), atol=1e-6)


def test_k3_is_clamped_like_verl():
    out = kl.estimate(torch.tensor([0.0, 0.0]), torch.tensor([50.0, -50.0]), kind="k3")
    # log-ratio clamped to ±20, result to ≤ 10: e^20 - 21 -> 10; e^-20 + 20 - 1 ≈ 19 -> 10
    assert out.tolist() == [10.0, 10.0]


def test_default_is_k3_and_none_is_zero():
    assert torch.equal(kl.estimate(LOGP, REF), kl.estimate(LOGP, REF, kind="k3"))
    assert torch.equal(kl.none(LOGP, REF), torch.zeros(1, 3))


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="kl.kind"):
        kl.estimate(LOGP, REF, kind="k4")
