"""Advantage estimators: per-token advantages ``[B, T]`` from rewards, values and group structure.

Registered functions take their tensors positionally, named only from ``token_rewards``, ``values``,
``mask``, ``scores``, ``group_index`` and the rollout's token annotations ``step_rewards``, ``step_ends``
(a task's step verifier), ``cut_values``, ``cuts``, ``token_probs`` (SPO-chain's stage, ``rlx_cli/sampling/credit.py``);
the engine passes them by name. ``scores`` ``[B]`` is one scalar reward per response; ``token_rewards``
``[B, T]`` is that score placed on the last real token minus any per-token KL penalty (see ``token_rewards``).
Masked entries of every output are 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from components.masked import as_bool, last_real, masked_var, masked_whiten
from components.registry import register

REWARD_NORMS = ("none", "group", "batch")  # reward_norm: z-scored scores before the estimator (Su et al. 2025)


def token_rewards(scores: Tensor, mask: Tensor, kl_penalty: Tensor | None = None) -> Tensor:
    """``scores`` ``[B]`` on the last real token of each row, minus ``kl_penalty`` ``[B, T]`` -> ``[B, T]``.

    ``kl_penalty`` is already multiplied by β (PPO-max / InstructGPT: r_t = score·[t = last] − β·KL_t).
    """
    real = as_bool(mask)
    rewards = torch.where(
        last_real(real), scores.unsqueeze(-1), torch.zeros((), dtype=scores.dtype, device=scores.device)
    )
    if kl_penalty is not None:
        rewards = rewards - kl_penalty
    return _zero_padding(rewards, real)


def whiten_and_clip(adv: Tensor, mask: Tensor, *, whiten: bool = True, clip: float | None = None) -> Tensor:
    """PPO-max (arXiv 2307.04964) advantage normalisation: whiten over the batch, then clip to ±clip."""
    if whiten:
        adv = masked_whiten(adv, mask)
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return _zero_padding(adv, as_bool(mask))


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor, *, rel_tol: float = 1e-4) -> Tensor:
    """1 − Var(R − V) / Var(R) over the real tokens (0-d tensor); 0 when R is constant (nothing to explain).

    R counts as constant when its std is at most ``rel_tol`` × the largest |R| or |V|: the rounding of GAE's
    returns, e.g. a minibatch whose answers all scored 1, where R = 1 ± 1e-7 would give −1e15.
    cleanrl / SB3 return NaN for Var(R) = 0; 0 keeps logged metrics and their averages finite.
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    real = as_bool(mask)
    scale = torch.cat([returns[real].abs(), values[real].abs(), returns.new_zeros(1)]).max()
    constant = var_returns <= (rel_tol * scale) ** 2
    ratio = masked_var(returns - values, mask, unbiased=False) / var_returns.clamp(min=torch.finfo(returns.dtype).tiny)
    return torch.where(constant, torch.zeros_like(ratio), 1 - ratio).detach()


@register("advantage", "gae", ranges={"gamma": (0.0, 1.0), "lam": (0.0, 1.0)})
def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float | Tensor = 0.95):
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438) -> (adv, returns).

    ``token_rewards``, ``values``, ``mask``: ``[B, T]``; ``lam``: a float or a ``[B]`` tensor, one λ per
    row (VC-PPO/VAPO decoupled and length-adaptive GAE). δ_t = r_t + γ·V_{t+1} − V_t and
    A_t = δ_t + γλ·A_{t+1}, taken over real tokens only: padding is skipped and the value after the
    last real token is 0 (no bootstrap). As in verl ``compute_gae_advantage_return``, the advantages
    are raw (whitening is ``whiten_and_clip``) and ``returns = adv + values``. Both ``[B, T]``.
    """
    real = as_bool(mask)
    token_rewards, values = token_rewards.detach(), values.detach()  # advantages are constants for the policy
    lam = torch.as_tensor(lam, dtype=values.dtype, device=values.device).expand(real.shape[0])
    next_value = torch.zeros(real.shape[0], dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    adv = torch.zeros(real.shape, dtype=values.dtype, device=values.device)
    for t in reversed(range(real.shape[-1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        step_adv = delta + gamma * lam * next_adv
        # a padded position passes the carry through unchanged
        next_adv = torch.where(real[:, t], step_adv, next_adv)
        next_value = torch.where(real[:, t], values[:, t], next_value)
        adv[:, t] = next_adv
    adv = _zero_padding(adv, real)
    return adv, _zero_padding(adv + values, real)


@register("advantage", "grpo", ranges={"eps": (0.0, 1.0)})
def grpo(scores: Tensor, group_index: Tensor, mask: Tensor, *, norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO outcome advantage (DeepSeekMath, arXiv 2402.03300) -> ``[B, T]``.

    ``scores`` ``[B]``, ``group_index`` ``[B]`` (long; equal ids = responses to one prompt), ``mask``
    ``[B, T]``. A = (s − group mean) / (group std + eps) with the unbiased std and eps = 1e-6, as verl
    ``compute_grpo_outcome_advantage``; ``norm_by_std=False`` is Dr. GRPO (arXiv 2503.20783), no std
    division. A singleton group gets its raw score (verl uses mean 0, std 1 there). The same value
    goes on every real token of the response.
    """
    scores = _floating(scores)
    mean, std, size = _group_stats(scores, group_index)
    centred = scores - mean
    adv = centred / (std + eps) if norm_by_std else centred
    return _broadcast(torch.where(size > 1, adv, scores), mask)


@register("advantage", "rloo", choices={"reward_norm": REWARD_NORMS})
def rloo(scores: Tensor, group_index: Tensor, mask: Tensor, *, reward_norm: str = "none") -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al., arXiv 2402.14740) -> ``[B, T]``.

    A_i = s_i − mean of the other K − 1 scores of the group = K/(K − 1)·(s_i − group mean), as verl
    ``compute_rloo_outcome_advantage``; no std normalisation. A singleton group gets its raw score.
    ``reward_norm`` (``group`` | ``batch``) first z-scores the scores (``zscore``), as Su et al. 2025 do for soft
    rewards from a judge.
    """
    scores = zscore(scores, group_index, by=reward_norm)
    mean, _, size = _group_stats(scores, group_index)
    adv = (scores - mean) * size / (size - 1).clamp(min=1)
    return _broadcast(torch.where(size > 1, adv, scores), mask)


@register("advantage", "reinforce_pp", ranges={"gamma": (0.0, 1.0)}, choices={"reward_norm": REWARD_NORMS})
def reinforce_pp(
    token_rewards: Tensor,
    mask: Tensor,
    scores: Tensor | None = None,
    group_index: Tensor | None = None,
    *,
    gamma: float = 1.0,
    reward_norm: str = "none",
) -> Tensor:
    """REINFORCE++ (arXiv 2501.03262): discounted return-to-go per token, whitened over the batch.

    ``token_rewards``, ``mask``: ``[B, T]`` -> ``[B, T]``. With the KL penalty folded into
    ``token_rewards`` the return at t carries −β·Σ_{i≥t} KL_i, as in the paper. Whitening is verl's
    ``masked_whiten`` over every real token of the batch (verl
    ``compute_reinforce_plus_plus_outcome_advantage``). ``reward_norm`` (``group`` | ``batch``) first replaces
    each score (``scores`` ``[B]``, on the last real token of ``token_rewards``) by its z-score (``zscore``), the KL
    penalty kept as it is: soft rewards of a judge (Su et al. 2025) then weigh against the KL at a fixed scale.
    """
    token_rewards = _normalised_scores(token_rewards, scores, group_index, mask, reward_norm)
    return masked_whiten(_returns_to_go(token_rewards, mask, gamma), mask)


@register("advantage", "reinforce_pp_baseline", choices={"reward_norm": REWARD_NORMS})
def reinforce_pp_baseline(
    token_rewards: Tensor, group_index: Tensor, mask: Tensor, scores: Tensor | None = None, *, reward_norm: str = "none"
) -> Tensor:
    """REINFORCE++ with a group baseline (arXiv 2501.03262, k > 1 samples per prompt) -> ``[B, T]``.

    G_t = Σ_{i≥t} r_i (γ = 1) minus b = the group mean of the sequence returns G_0 = Σ_t r_t, then
    whitened over every real token of the batch. When ``token_rewards`` holds only the score (KL in
    the loss, as the paper recommends) this equals OpenRLHF ``reinforce_baseline``: subtract the group
    mean of the scores, compute returns, whiten globally. With KL folded into the reward, b here also
    averages the KL sums (OpenRLHF averages the scores only). A singleton group has b = 0. ``reward_norm`` as in
    ``reinforce_pp``.
    """
    token_rewards = _normalised_scores(token_rewards, scores, group_index, mask, reward_norm)
    real = as_bool(mask)
    returns = _returns_to_go(token_rewards, real, 1.0)
    sequence_returns = torch.where(real, token_rewards.detach(), 0).sum(dim=-1)
    baseline, _, size = _group_stats(sequence_returns, group_index)
    baseline = torch.where(size > 1, baseline, torch.zeros_like(baseline))
    return masked_whiten(returns - baseline.unsqueeze(-1), real)


@register("advantage", "grpo_process", ranges={"eps": (0.0, 1.0), "outcome_weight": (0.0, 1.0)})
def grpo_process(
    step_rewards: Tensor,
    step_ends: Tensor,
    group_index: Tensor,
    mask: Tensor,
    scores: Tensor | None = None,
    *,
    eps: float = 1e-6,
    outcome_weight: float = 0.0,
) -> Tensor:
    """GRPO with process supervision (DeepSeekMath, arXiv 2402.03300, §4.1.3) -> ``[B, T]``.

    ``step_rewards`` ``[B, T]``: each step's reward r at its last token; ``step_ends`` ``[B, T]`` bool (or 0/1):
    where a step ends; ``group_index`` ``[B]``; ``mask`` ``[B, T]``; ``scores`` ``[B]`` (only for the mix). Every
    step reward is normalised over ALL steps of ALL outputs of its group, r̃ = (r − mean) / (std + eps) with the
    unbiased std and eps as ``grpo`` (the paper does not say which std); a group with a single step keeps its raw
    reward (as ``grpo``'s singleton groups). Token t gets the sum of r̃ over the steps of its own row that end at
    or after t (the step containing t counts); tokens after the last step's end, and rows without steps, get 0.

    ``outcome_weight`` w (rlx's option, not the paper's): (1 − w)·process + w·``grpo(scores)``, so 0 is the
    paper's process supervision and 1 is outcome GRPO; in between mixes the two advantages.
    """
    real = as_bool(mask)
    ends = as_bool(step_ends) & real
    rewards = torch.where(ends, _floating(step_rewards).detach(), 0.0)
    _, inverse = torch.unique(group_index, return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, inverse, ends.sum(-1).to(rewards.dtype)
    )
    total = torch.zeros_like(count).index_add_(0, inverse, rewards.sum(-1))
    mean = (total / count.clamp(min=1))[inverse].unsqueeze(-1)  # [B, 1]
    squares = torch.where(ends, (rewards - mean) ** 2, 0.0).sum(-1)
    std = (torch.zeros_like(count).index_add_(0, inverse, squares) / (count - 1).clamp(min=1)).sqrt()[inverse]
    normalised = torch.where(count[inverse].unsqueeze(-1) > 1, (rewards - mean) / (std.unsqueeze(-1) + eps), rewards)
    process = torch.where(ends, normalised, 0.0).flip(-1).cumsum(-1).flip(-1)  # Σ over steps ending at or after t
    process = _zero_padding(process, real)
    if outcome_weight == 0:
        return process
    if scores is None:
        raise ValueError("grpo_process: outcome_weight > 0 needs scores [B]")
    return (1 - outcome_weight) * process + outcome_weight * grpo(scores, group_index, mask, eps=eps)


def spo_cutpoints(token_probs: Tensor, mask: Tensor, *, prob_threshold: float = 0.9, interval: int = 5) -> Tensor:
    """SPO-chain's cutpoints (Guo et al. 2025; AIFrameResearch/SPO ``_create_value_estimation_requests``) -> ``[B, T]``
    bool, true at token t when the state before t (after response token t − 1; t = 0: the prompt alone) is one.

    ``token_probs``, ``mask``: ``[B, T]``, the sampling probability of each response token (temperature-scaled).
    The low-probability tokens (p < ``prob_threshold``) of a row, in order; the 1st, (1 + interval)-th,
    (1 + 2·interval)-th ... of them are cut before (the reference's ``where(p < 0.9) − 1``, then ``[::interval]``).
    """
    low = as_bool(mask) & (token_probs < prob_threshold)
    rank = low.long().cumsum(-1) - 1  # 0 for the row's first low-probability token
    return low & (rank % interval == 0)


@register("advantage", "spo_chain", ranges={"prob_threshold": (0.0, 1.0)})
def spo_chain(
    cut_values: Tensor,
    cuts: Tensor,
    token_probs: Tensor,
    scores: Tensor,
    mask: Tensor,
    *,
    prob_threshold: float = 0.9,
    whiten_low_prob: bool = True,
) -> Tensor:
    """SPO-chain's segment advantages (Guo et al. 2025, "Segment Policy Optimization"; AIFrameResearch/SPO
    ``_compute_token_advantages``) -> ``[B, T]``.

    ``cuts`` ``[B, T]`` bool (or 0/1): a cutpoint before token t (``spo_cutpoints``); ``cut_values`` ``[B, T]``: the
    Monte-Carlo value V there (read only at cutpoints); ``token_probs`` ``[B, T]``: each token's sampling
    probability; ``scores`` ``[B]``: the final reward R, the terminal value; ``mask`` ``[B, T]``.

    In the reference's terms (cutpoint c = t − 1, the state after token c): tokens in (c_{k−1}, c_k] get
    V(c_k) − V(c_{k−1}), the last segment (c_K, end] gets R − V(c_K), and the first segment [0, c_0] gets 0 unless
    c_0 = −1 (a cutpoint before token 0, the prompt alone, whose V is then the base). A row without a cutpoint gets
    all zeros. Then each token keeps its advantage only if p ≤ ``prob_threshold`` (the probability mask).
    ``whiten_low_prob``: whitened over the batch's kept tokens only, as the reference's trainer (``masked_whiten``),
    the others 0.
    """
    real = as_bool(mask)
    cut = as_bool(cuts) & real
    values = _floating(cut_values).detach()
    width = real.shape[-1]
    positions = torch.arange(width, device=real.device).expand_as(real)
    last_cut = torch.where(cut, positions, -1).cummax(-1).values  # the latest cutpoint at or before t
    first_from = torch.where(cut, positions, width).flip(-1).cummin(-1).values.flip(-1)  # the first at or after t
    next_cut = torch.cat([first_from[:, 1:], torch.full_like(first_from[:, :1], width)], -1)  # the first after t
    base = values.gather(-1, last_cut.clamp(min=0))
    final = _floating(scores).detach().unsqueeze(-1).expand_as(values)
    target = torch.where(next_cut < width, values.gather(-1, next_cut.clamp(max=width - 1)), final)
    adv = torch.where(last_cut >= 0, target - base, 0.0)
    kept = real & (token_probs <= prob_threshold)
    if whiten_low_prob:
        return masked_whiten(adv, kept)
    return _zero_padding(adv, kept)


def zscore(scores: Tensor, group_index: Tensor | None, *, by: str, eps: float = 1e-6) -> Tensor:
    """Scores ``[B]`` as z-scores (s − mean) / (std + eps), unbiased std as in ``grpo``: over each group
    (``by="group"``; a singleton group keeps its raw score, as in ``grpo``) or over the whole batch (``"batch"``);
    ``"none"`` returns them as they are."""
    scores = _floating(scores)
    if by == "none":
        return scores
    if by == "batch":
        std = scores.std() if scores.numel() > 1 else scores.new_zeros(())
        return (scores - scores.mean()) / (std + eps)
    mean, std, size = _group_stats(scores, group_index)
    return torch.where(size > 1, (scores - mean) / (std + eps), scores)


def _normalised_scores(rewards: Tensor, scores: Tensor | None, group_index, mask: Tensor, by: str) -> Tensor:
    """``rewards`` ``[B, T]`` with each row's score, on its last real token, replaced by ``zscore(scores, by=by)``."""
    if by == "none":
        return rewards
    return rewards + token_rewards(zscore(scores, group_index, by=by) - _floating(scores), mask)


def _returns_to_go(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + γ·G_{t+1} over real tokens only (padding skipped, 0 after the last) -> ``[B, T]``."""
    real = as_bool(mask)
    token_rewards = token_rewards.detach()
    running = torch.zeros(real.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    returns = torch.zeros(real.shape, dtype=token_rewards.dtype, device=token_rewards.device)
    for t in reversed(range(real.shape[-1])):
        running = torch.where(real[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return _zero_padding(returns, real)


def _group_stats(scores: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row group mean, unbiased group std (0 for singletons) and group size, each ``[B]``."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    scores = _floating(scores)
    size = counts.to(scores.dtype)
    sums = torch.zeros_like(size).index_add_(0, inverse, scores)
    mean = (sums / size)[inverse]
    squares = torch.zeros_like(size).index_add_(0, inverse, (scores - mean) ** 2)
    std = (squares / (size - 1).clamp(min=1)).sqrt()[inverse]
    return mean, std, size[inverse]


def _broadcast(per_row: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` -> ``[B, T]``: the row's value on its real tokens, 0 on padding."""
    real = as_bool(mask)
    return _zero_padding(per_row.unsqueeze(-1).expand(real.shape), real)


def _zero_padding(x: Tensor, real: Tensor) -> Tensor:
    return torch.where(real, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _floating(x: Tensor) -> Tensor:
    """Integer scores (0/1 verifiers) as the default float dtype."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())
