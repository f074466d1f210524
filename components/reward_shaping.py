"""Reward shaping on the scalar scores, before they become token rewards (PPO-max, arXiv 2307.04964).

Running statistics live in an explicit ``state`` dict of tensors that the caller keeps between
steps (``{}`` at first), so the functions stay pure: ``fn(scores [B], state) -> (shaped [B], new_state)``.
The moments follow MOSS-RLHF's ``RunningMoments`` (PPO-max's code, after trlx/SB3): update with the
batch first, then shape that batch with the updated mean and the unbiased std of every score seen.
``overlong_penalty`` (DAPO) is a pure function of the response lengths, added to the scores before shaping.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.registry import register


def update_moments(scores: Tensor, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Merge the batch ``scores`` ``[B]`` into ``state`` {count, mean, m2} (Chan et al.'s parallel Welford)."""
    batch = scores.detach().to(torch.float64).flatten()
    count = state.get("count", batch.new_zeros(()))
    mean = state.get("mean", batch.new_zeros(()))
    m2 = state.get("m2", batch.new_zeros(()))
    n = batch.numel()
    if n == 0:
        return {"count": count, "mean": mean, "m2": m2}
    batch_mean = batch.mean()
    batch_m2 = ((batch - batch_mean) ** 2).sum()
    total = count + n
    delta = batch_mean - mean
    return {"count": total, "mean": mean + delta * n / total, "m2": m2 + batch_m2 + delta**2 * count * n / total}


def running_std(state: dict[str, Tensor], eps: float) -> Tensor:
    """Unbiased std of all scores seen; 1 while it is undefined (< 2 scores) or ≤ eps (all scores equal)."""
    count, m2 = state["count"], state["m2"]
    std = (m2 / (count - 1).clamp(min=1)).sqrt()
    return torch.where((count > 1) & (std > eps), std, torch.ones_like(std))


@register("reward_shaping", "none")
def none(scores: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """Identity: scores ``[B]`` unchanged, state passed through."""
    return scores, state


@register("reward_shaping", "scale", ranges={"eps": (0.0, 1.0)})
def scale(scores: Tensor, state: dict[str, Tensor], *, eps: float = 1e-8) -> tuple[Tensor, dict[str, Tensor]]:
    """Reward scaling r / σ_running (PPO-max): no mean shift, since advantages are normalised later."""
    state = update_moments(scores, state)
    return (scores / running_std(state, eps)).to(scores.dtype), state


@register("reward_shaping", "normalize_clip", ranges={"clip": (0.0, math.inf), "eps": (0.0, 1.0)})
def normalize_clip(
    scores: Tensor, state: dict[str, Tensor], *, clip: float = 10.0, eps: float = 1e-8
) -> tuple[Tensor, dict[str, Tensor]]:
    """Reward normalisation and clipping, clip((r − r̄)/σ, −clip, clip) with running r̄, σ (PPO-max).

    ``clip = 10`` is the ``reward_clip`` default of MOSS-RLHF's ``config_ppo.py`` (the paper gives no value).
    """
    state = update_moments(scores, state)
    normalised = (scores - state["mean"]) / running_std(state, eps)
    return normalised.clamp(-clip, clip).to(scores.dtype), state


def overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int) -> Tensor:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13) -> ``[B]`` float, added to the correctness score.

    ``lengths`` ``[B]``: generated tokens per response, EOS included (``mask.sum(1)``). With L_max = ``max_len``
    and L_cache = ``cache_len``: 0 if |y| ≤ L_max − L_cache; ((L_max − L_cache) − |y|) / L_cache, from 0 down to
    −1, if L_max − L_cache < |y| ≤ L_max; −1 beyond (impossible when answers are cut at L_max). Paper: L_max
    20,480, L_cache 4,096. ``cache_len`` 0: no soft band, 0 up to L_max. Not a registered member (those take
    ``(scores, state)``): the engine adds it to the scores before ``reward_shaping``, ``max_len`` defaulting to
    ``rollout.max_new_tokens``.
    """
    if max_len < 1 or not 0 <= cache_len <= max_len:
        raise ValueError(f"overlong_penalty needs max_len >= 1 and 0 <= cache_len <= max_len ({max_len}, {cache_len})")
    lengths = lengths if lengths.is_floating_point() else lengths.float()
    start = max_len - cache_len
    linear = (start - lengths) / max(cache_len, 1)
    penalty = torch.where(lengths <= max_len, linear, torch.full_like(lengths, -1.0))
    return torch.where(lengths <= start, torch.zeros_like(lengths), penalty)


@register("reward_shaping", "dapo", ranges={"cache_len": (0, math.inf)})
def dapo(
    scores: Tensor,
    state: dict[str, Tensor],
    lengths: Tensor,
    *,
    max_len: int | None = None,
    cache_len: int | None = None,
    correct: float = 1.0,
    wrong: float = -1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DAPO's reward (arXiv 2503.14476): the verifier's score mapped to ``wrong`` .. ``correct`` (±1 in the paper;
    linear in between for soft scores), plus the soft overlong punishment (``overlong_penalty``).

    ``scores``, ``lengths``: ``[B]`` (``lengths`` counts generated tokens, EOS included). ``max_len``: the engine
    passes ``rollout.max_new_tokens``. ``cache_len`` None: a fifth of ``max_len``, the paper's 4,096 of 20,480.
    No running statistics: ``state`` passes through.
    """
    band = max_len // 5 if cache_len is None else min(cache_len, max_len)
    shaped = wrong + (correct - wrong) * scores.to(torch.get_default_dtype())
    return shaped + overlong_penalty(lengths, max_len=max_len, cache_len=band).to(shaped.device), state
