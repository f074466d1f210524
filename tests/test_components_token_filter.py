"""token_filter: the 80/20 rule's top-k by entropy on hand-made tensors (ties, padding, empty batches)."""

import pytest
import torch

from components import registry, token_filter

# row 0 has a padded token with the largest entropy (9.0), which must never be picked; N = 7 real tokens
ENTROPY = torch.tensor([[0.5, 2.0, 1.0, 9.0], [3.0, 0.1, 2.0, 2.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def picked(**kw) -> list[list[bool]]:
    return token_filter.high_entropy(ENTROPY, MASK, **kw).tolist()


def test_default_keeps_ceil_of_a_fifth_pooled_over_rows_ties_by_position():
    # k = max(1, ⌈7·0.2⌉) = ⌈1.4⌉ = 2: 3.0 (row 1), then 2.0 — three tokens tie; the first in row-major order
    # (row 0, position 1) is taken, not row 1's
    assert picked() == [[False, True, False, False], [True, False, False, False]]


def test_half_takes_four_and_the_next_ties_in_order():
    # ⌈3.5⌉ = 4: 3.0, then all three 2.0s (row 0 t1, row 1 t2, row 1 t3); the padded 9.0 never
    assert picked(top_ratio=0.5) == [[False, True, False, False], [True, False, True, True]]


def test_all_ties_take_the_first_k_real_tokens():
    flat = torch.ones(2, 4)
    out = token_filter.high_entropy(flat, MASK, top_ratio=0.5)  # ⌈3.5⌉ = 4 of 7 equal entropies
    assert out.tolist() == [[True, True, True, False], [True, False, False, False]]


def test_count_is_exactly_ceil_without_float_noise():
    entropy = torch.arange(15.0).view(3, 5)
    # 0.2·15 = 3.0000000000000004 in floats: a plain ceil would keep 4
    assert token_filter.high_entropy(entropy, torch.ones(3, 5)).sum().item() == 3
    assert token_filter.high_entropy(entropy, torch.ones(3, 5), top_ratio=0.21).sum().item() == 4  # ⌈3.15⌉


def test_at_least_one_and_at_most_every_real_token():
    assert sum(map(sum, picked(top_ratio=0.0))) == 1  # max(1, ⌈0⌉)
    assert picked(top_ratio=1.0) == (MASK > 0).tolist()


def test_empty_mask_selects_nothing():
    out = token_filter.high_entropy(ENTROPY, torch.zeros(2, 4))
    assert out.dtype == torch.bool and out.shape == (2, 4) and not out.any()


def test_none_selects_every_real_token_and_all_are_registered():
    assert token_filter.none(MASK).tolist() == (MASK > 0).tolist()
    assert registry.names("token_filter") == ["high_entropy", "low_probability", "none"]  # low_probability: SPO


def test_selection_metrics():
    selected = token_filter.high_entropy(ENTROPY, MASK, top_ratio=0.5)
    metrics = token_filter.selection_metrics(ENTROPY, MASK, selected)
    assert metrics["selected_frac"].item() == pytest.approx(4 / 7)
    assert metrics["selected_entropy"].item() == pytest.approx((3.0 + 2.0 + 2.0 + 2.0) / 4)
