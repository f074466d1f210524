"""lam_schedule: per-row policy λ."""

import pytest
import torch

from components import lam_schedule


def test_length_adaptive_by_hand():
    lengths = torch.tensor([0, 1, 2, 4, 10, 60])
    # 1 - 1/(0.5·l): l=0 -> 0; l=1 -> -1 -> clamp 0; l=2 -> 0; 4 -> 0.5; 10 -> 0.8; 60 -> 1 - 1/30
    expected = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.8, 1 - 1 / 30])
    assert torch.allclose(lam_schedule.length_adaptive(lengths), expected)


def test_length_adaptive_alpha_and_float_lengths():
    out = lam_schedule.length_adaptive(torch.tensor([1000.0, 20.0]), alpha=0.05)
    assert out.tolist() == pytest.approx([0.98, 0.0])  # 1 - 1/50; 1 - 1/1 = 0
    assert out.dtype.is_floating_point
    assert (lam_schedule.length_adaptive(torch.tensor([1e9])) <= 1.0).all()


@pytest.mark.parametrize("fn", [lam_schedule.coupled, lam_schedule.decoupled])
def test_constant_schedules(fn):
    out = fn(torch.tensor([3, 7, 0]), policy_lam=0.9)
    assert out.dtype.is_floating_point
    assert out.tolist() == pytest.approx([0.9, 0.9, 0.9])
    assert fn(torch.tensor([5])).tolist() == pytest.approx([0.95])
