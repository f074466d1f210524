"""reward_shaping: running moments against numpy, purity of the state dict."""

import numpy as np
import pytest
import torch

from components import reward_shaping

BATCHES = [[1.0, 2.0, 4.0], [0.5], [10.0, -3.0, 2.0, 2.0], [7.0, 7.0]]


def test_running_moments_match_numpy():
    state, seen = {}, []
    for batch in BATCHES:
        state = reward_shaping.update_moments(torch.tensor(batch), state)
        seen += batch
        assert state["count"].item() == len(seen)
        assert state["mean"].item() == pytest.approx(np.mean(seen))
        assert (state["m2"] / (state["count"] - 1)).item() == pytest.approx(np.var(seen, ddof=1))


def test_scale_divides_by_running_std():
    state, seen = {}, []
    for batch in BATCHES:
        shaped, state = reward_shaping.scale(torch.tensor(batch), state)
        seen += batch
        assert np.allclose(shaped.numpy(), np.array(batch) / np.std(seen, ddof=1), atol=1e-6)


def test_normalize_clip_against_numpy():
    state, seen = {}, []
    for batch in BATCHES:
        shaped, state = reward_shaping.normalize_clip(torch.tensor(batch), state, clip=1.0)
        seen += batch
        expected = np.clip((np.array(batch) - np.mean(seen)) / np.std(seen, ddof=1), -1.0, 1.0)
        assert np.allclose(shaped.numpy(), expected, atol=1e-6)
        assert shaped.dtype == torch.float32


def test_undefined_std_falls_back_to_one():
    shaped, state = reward_shaping.scale(torch.tensor([3.0]), {})  # one score: no std yet
    assert shaped.tolist() == [3.0]
    shaped, _ = reward_shaping.scale(torch.tensor([3.0, 3.0]), state)  # all equal: std 0
    assert shaped.tolist() == [3.0, 3.0]


def test_functions_are_pure():
    state = {}
    _, new_state = reward_shaping.normalize_clip(torch.tensor([1.0, 2.0]), state)
    assert state == {} and new_state["count"].item() == 2
    before = {k: v.clone() for k, v in new_state.items()}
    reward_shaping.scale(torch.tensor([5.0]), new_state)
    assert all(torch.equal(before[k], new_state[k]) for k in before)
    scores = torch.tensor([1.0, -1.0])
    same, kept = reward_shaping.none(scores, new_state)
    assert same is scores and kept is new_state


def test_overlong_penalty_each_branch():
    # L_max 20, L_cache 4: 0 up to 16 tokens, then (16 − |y|)/4 down to −1 at 20, −1 beyond
    lengths = torch.tensor([1, 16, 17, 18, 19, 20, 21, 40])
    penalty = reward_shaping.overlong_penalty(lengths, max_len=20, cache_len=4)
    assert penalty.tolist() == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert penalty.dtype == torch.float32


def test_overlong_penalty_without_a_soft_band_and_bad_lengths():
    lengths = torch.tensor([20.0, 21.0])
    assert reward_shaping.overlong_penalty(lengths, max_len=20, cache_len=0).tolist() == [0.0, -1.0]
    assert reward_shaping.overlong_penalty(lengths, max_len=20, cache_len=20).tolist() == [-1.0, -1.0]  # 0 - 20/20
    with pytest.raises(ValueError, match="cache_len <= max_len"):
        reward_shaping.overlong_penalty(lengths, max_len=4, cache_len=5)


def test_dapo_reward_by_hand():
    # max_len 10, cache_len None -> a fifth: 2; penalty 0 up to 8 tokens, (8 - |y|) / 2 at 9 and 10
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5])
    lengths = torch.tensor([3, 8, 9, 10, 4])
    shaped, state = reward_shaping.dapo(scores, {"count": torch.tensor(1.0)}, lengths, max_len=10)
    assert torch.allclose(shaped, torch.tensor([1.0, -1.0, 1.0 - 0.5, -1.0 - 1.0, 0.0]))
    assert state == {"count": torch.tensor(1.0)}  # no running statistics
    shaped, _ = reward_shaping.dapo(scores, {}, lengths, max_len=10, cache_len=0, wrong=0.0)  # 0/1 and no soft band
    assert torch.equal(shaped, scores)
