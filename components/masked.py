"""Masked reductions and selections over ``[B, T]`` tensors: only entries where ``mask`` is true count.

Conventions follow verl ``verl/utils/torch_functional.py`` (``masked_mean``, ``masked_var``,
``masked_whiten``): the variance is unbiased (Bessel-corrected) and whitening divides by
``sqrt(var + eps)`` with ``eps = 1e-8``. Two deliberate differences: masked entries are dropped with
``torch.where`` (so NaN/inf garbage in padding cannot leak through ``0 * nan``), and an empty or
single-entry mask returns a finite value instead of raising.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def as_bool(mask: Tensor) -> Tensor:
    """``mask`` as a bool tensor (0/1 float or bool in)."""
    return mask if mask.dtype == torch.bool else mask != 0


def last_real(mask: Tensor) -> Tensor:
    """``[B, T]`` mask -> bool ``[B, T]``, true only at each row's last real entry (none in a row without one)."""
    real = as_bool(mask)
    counts = real.cumsum(-1)
    return real & (counts == counts[..., -1:])


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x over entries where ``mask`` is true; ``x``, ``mask``: same shape (e.g. ``[B, T]``)."""
    zeros = torch.zeros((), dtype=x.dtype, device=x.device)
    kept = torch.where(as_bool(mask), x, zeros)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of true entries of ``mask`` (float), over ``dim`` or all."""
    m = as_bool(mask).float()
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m / Σ m over ``dim`` (all entries if None); 0 where the mask is empty."""
    count = masked_count(mask, dim).to(x.dtype)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """The largest entry of ``x`` where ``mask`` is true (0-d); 0 where the mask is empty."""
    mask = as_bool(mask)
    return x.masked_fill(~mask, float("-inf")).amax() if mask.any() else x.new_zeros(())


def masked_var(x: Tensor, mask: Tensor, *, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries of ``x`` (a 0-d tensor); unbiased as in verl, 0 for < 2 entries."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    count = masked_count(mask).to(x.dtype)
    if unbiased:
        var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), var)
    return var


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """``(x − mean) / sqrt(var + eps)`` over the masked entries of ``x`` (verl ``masked_whiten``).

    With ``shift_mean=False`` the mean is added back (only the scale changes). Masked entries come
    back as 0. ``x``, ``mask``: ``[B, T]``; returns ``[B, T]``.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(as_bool(mask), whitened, torch.zeros((), dtype=x.dtype, device=x.device))


def share_count(n: int, ratio: float, *, round_up: bool = False) -> int:
    """⌊ratio·n⌋ (or ⌈ratio·n⌉ with ``round_up``) of the decimal product: rounded to 9 places first, so float
    noise cannot move it by one (0.2 · 15 = 3.0000000000000004 in floats, and ⌈·⌉ would give 4)."""
    product = round(ratio * n, 9)
    return math.ceil(product) if round_up else math.floor(product)


def masked_top_k(scores: Tensor, mask: Tensor, k: int) -> Tensor:
    """The ``k`` largest ``scores`` among the true entries of ``mask`` -> bool tensor of ``mask``'s shape.

    Pooled over all entries (for ``[B, T]``: across rows). Ties are broken by position: among equal scores the
    entry that comes first in row-major order (lower row, then earlier token) is taken, so exactly
    ``min(k, Σmask)`` entries are true and the choice never depends on the device or the sort kernel.
    """
    real = as_bool(mask).flatten()
    positions = real.nonzero().squeeze(1)  # row-major order
    order = torch.sort(scores.detach().flatten()[positions], descending=True, stable=True).indices
    picked = torch.zeros_like(real)
    picked[positions[order[: max(k, 0)]]] = True
    return picked.view(mask.shape)
