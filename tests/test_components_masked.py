"""masked_* helpers: verl conventions, NaN-proof padding."""

import math

import pytest
import torch

from components.masked import masked_max, masked_mean, masked_sum, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, math.nan], [3.0, 4.0, 5.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_sum_and_mean():
    assert masked_sum(X, M).item() == 15.0  # 1+2+3+4+5
    assert masked_mean(X, M).item() == 3.0
    assert masked_mean(X, M, dim=-1).tolist() == [1.5, 4.0]  # 3/2, 12/3
    assert masked_mean(X, torch.zeros_like(M)).item() == 0.0


def test_var_is_unbiased_like_torch_var():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert masked_var(X, M).item() == pytest.approx(values.var().item())  # 10/4 = 2.5
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(2.0)  # 10/5
    assert masked_var(X, torch.tensor([[1.0, 0, 0], [0, 0, 0]])).item() == 0.0  # one entry: no Bessel, no NaN


def test_whiten():
    out = masked_whiten(X, M)
    expected = (torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]) - 3.0) / math.sqrt(2.5 + 1e-8)
    assert torch.allclose(out[M.bool()], expected)
    assert out[0, 2].item() == 0.0  # padding comes back as 0
    unshifted = masked_whiten(X, M, shift_mean=False)
    assert torch.allclose(unshifted[M.bool()], expected + 3.0)


def test_share_count_floor_and_ceil_of_the_decimal_product():
    from components.masked import share_count

    assert share_count(15, 0.2) == 3 and share_count(15, 0.2, round_up=True) == 3  # 3.0000000000000004
    assert share_count(100, 0.29) == 29  # 28.999999999999996 in floats
    assert share_count(7, 0.2) == 1 and share_count(7, 0.2, round_up=True) == 2
    assert share_count(6, 2e-4) == 0 and share_count(0, 0.5, round_up=True) == 0


def test_masked_top_k_pools_rows_skips_padding_breaks_ties_by_position():
    from components.masked import masked_top_k

    scores = torch.tensor([[1.0, 5.0, 2.0], [2.0, 2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    assert masked_top_k(scores, mask, 2).tolist() == [[False, True, True], [False, False, False]]  # 5, then the 1st 2
    assert masked_top_k(scores, mask, 10).tolist() == (mask > 0).tolist()
    assert not masked_top_k(scores, torch.zeros(2, 3), 3).any()


def test_masked_max_ignores_padding_even_where_real_values_are_negative():
    x = torch.tensor([[-3.0, -1.0, 9.0], [-2.0, 5.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_max(x, mask).item() == -1.0  # not 9 (padding), not 0 (a fill value)
    assert masked_max(x, torch.zeros_like(mask)).item() == 0.0
