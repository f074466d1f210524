"""loss_agg.aggregate on hand-computed tensors."""

import math

import pytest
import torch

from components import loss_agg

NAN = math.nan
# L: two rows, the padded entries hold garbage (NaN must not leak through)
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, 5.0, 99.0, NAN]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_mean", 3.0),  # (1+2+3+4+5) / 5
        ("seq_mean_token_mean", 3.25),  # (6/3 + 9/2) / 2 = (2 + 4.5) / 2
        ("seq_mean_token_sum", 7.5),  # (6 + 9) / 2
        ("seq_mean_token_sum_norm", 1.875),  # 15 / (B·T) = 15 / (2·4)
    ],
)
def test_modes_by_hand(mode, expected):
    assert loss_agg.aggregate(PER_TOKEN, MASK, mode=mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", loss_agg.MODES)
def test_bool_mask_same_as_float(mode):
    a = loss_agg.aggregate(PER_TOKEN, MASK, mode=mode)
    b = loss_agg.aggregate(PER_TOKEN, MASK.bool(), mode=mode)
    assert a.item() == pytest.approx(b.item())


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_padding_columns_change_nothing(mode):
    # seq_mean_token_sum_norm divides by T on purpose (Dr. GRPO's constant), so it is left out
    padded = torch.cat([PER_TOKEN, torch.full((2, 3), 1e6)], dim=-1)
    padded_mask = torch.cat([MASK, torch.zeros(2, 3)], dim=-1)
    assert loss_agg.aggregate(padded, padded_mask, mode=mode).item() == pytest.approx(
        loss_agg.aggregate(PER_TOKEN, MASK, mode=mode).item()
    )


@pytest.mark.parametrize("mode", loss_agg.MODES)
def test_empty_mask_gives_zero_not_nan(mode):
    out = loss_agg.aggregate(torch.full((2, 3), NAN), torch.zeros(2, 3), mode=mode)
    assert out.item() == 0.0


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_mean", 1.5),  # (1+2) / 2
        ("seq_mean_token_mean", 1.5),  # the empty row is left out: (3/2) / 1
        ("seq_mean_token_sum", 3.0),  # 3 / 1
        ("seq_mean_token_sum_norm", 0.75),  # 3 / (2·2): B counts every row
    ],
)
def test_empty_row(mode, expected):
    per_token = torch.tensor([[1.0, 2.0], [7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert loss_agg.aggregate(per_token, mask, mode=mode).item() == pytest.approx(expected)


def test_token_mean_gradient_is_mask_over_count():
    per_token = torch.zeros(2, 4, requires_grad=True)
    loss_agg.aggregate(per_token, MASK, mode="token_mean").backward()
    assert torch.allclose(per_token.grad, MASK / 5)


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="loss_agg.mode"):
        loss_agg.aggregate(PER_TOKEN, MASK, mode="sum")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("token_mean", 5.0), ("seq_mean_token_mean", 2.0), ("seq_mean_token_sum", 2.0), ("seq_mean_token_sum_norm", 8.0)],
)
def test_denominator_by_hand(mode, expected):
    assert loss_agg.denominator(MASK, mode=mode).item() == expected


@pytest.mark.parametrize("mode", loss_agg.MODES)
def test_parts_weighted_by_their_denominators_add_up_to_the_whole(mode):
    """How data-parallel processes split a loss: Σ_parts aggregate(part)·D(part)/ΣD = aggregate(whole)."""
    per_token = torch.arange(15.0).view(5, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0], [1, 0, 0]]).float()
    parts = [slice(0, 2), slice(2, 3), slice(3, 5)]  # one part without a real token
    total = sum(loss_agg.denominator(mask[p], mode=mode) for p in parts)
    weighted = sum(
        loss_agg.aggregate(per_token[p], mask[p], mode=mode) * loss_agg.denominator(mask[p], mode=mode) / total
        for p in parts
    )
    assert weighted.item() == pytest.approx(loss_agg.aggregate(per_token, mask, mode=mode).item())
