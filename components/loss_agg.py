"""How a ``[B, T]`` per-token loss becomes one scalar.

The mode names follow verl ``core_algos.agg_loss`` (with ``_`` for ``-``). The choice matters:
DAPO (arXiv 2503.14476) and VAPO (arXiv 2504.05118) use ``token_mean`` so long answers weigh by their
tokens; GRPO (arXiv 2402.03300) uses ``seq_mean_token_mean``; Dr. GRPO (arXiv 2503.20783) uses
``seq_mean_token_sum_norm``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from components.masked import masked_count, masked_sum
from components.registry import register

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


@register("loss_agg", "aggregate", choices={"mode": MODES})
def aggregate(per_token: Tensor, mask: Tensor, *, mode: str = "token_mean") -> Tensor:
    """Aggregate ``per_token`` ``[B, T]`` over the real tokens ``mask`` ``[B, T]`` -> 0-d tensor.

    L = per-token loss, m = mask, T = ``mask.shape[-1]``:

    - ``token_mean``: ΣLm / Σm.
    - ``seq_mean_token_mean``: mean over rows of (Σ_t Lm / Σ_t m).
    - ``seq_mean_token_sum``: mean over rows of Σ_t Lm.
    - ``seq_mean_token_sum_norm``: ΣLm / (B·T), Dr. GRPO's constant normaliser (as in its code,
      ``understand-r1-zero``; verl divides by T only, which differs by the constant B).

    Rows without a real token (batch padding) are left out of the two ``seq_mean`` means, so padding
    never changes a result; an empty mask gives 0, never NaN.
    """
    if mode == "token_mean":
        return masked_sum(per_token, mask) / masked_count(mask).clamp(min=1)
    if mode == "seq_mean_token_sum_norm":
        return masked_sum(per_token, mask) / max(mask.numel(), 1)
    row_tokens = masked_count(mask, dim=-1)
    row_sums = masked_sum(per_token, mask, dim=-1)
    if mode == "seq_mean_token_mean":
        row_losses = row_sums / row_tokens.clamp(min=1)
    elif mode == "seq_mean_token_sum":
        row_losses = row_sums
    else:
        raise ValueError(f"loss_agg.mode={mode!r} is not valid (valid: {', '.join(MODES)})")
    real_rows = row_tokens > 0
    return masked_sum(row_losses, real_rows) / masked_count(real_rows).clamp(min=1)


def denominator(mask: Tensor, *, mode: str = "token_mean") -> Tensor:
    """What ``aggregate`` divides by for ``mask`` ``[B, T]`` -> 0-d float tensor (before its clamp at 1).

    ``token_mean``: Σm; the two ``seq_mean`` row means: the rows with a real token;
    ``seq_mean_token_sum_norm``: B·T. A batch split into parts aggregates to Σ_parts aggregate(part) ·
    D(part) / ΣD (for ``seq_mean_token_sum_norm`` when every part keeps the width T): how data-parallel
    processes weight their losses (``rlx_cli/engine/distributed.py``).
    """
    if mode == "token_mean":
        return masked_count(mask)
    if mode == "seq_mean_token_sum_norm":
        return torch.tensor(float(mask.numel()))
    if mode in MODES:
        return masked_count(masked_count(mask, dim=-1) > 0)
    raise ValueError(f"loss_agg.mode={mode!r} is not valid (valid: {', '.join(MODES)})")


def row_weights(mask: Tensor, *, mode: str = "token_mean") -> Tensor:
    """Each row's weight in ``aggregate``, as a weighted sum of the rows' mean losses: aggregate(L) = Σ_i w_i ·
    mean_t(L_i) over the real tokens of ``mask`` [B, T] -> w [B] (0 for a row without a real token). ``token_mean``
    weighs a row by its tokens, len_i / Σ len; the ``seq_mean`` modes by 1 / B (``token_mean``) or len_i / B
    (``token_sum``); ``seq_mean_token_sum_norm`` by len_i / (B·T)."""
    lengths = masked_count(mask, dim=-1).float()
    if mode == "token_mean":
        return lengths / lengths.sum().clamp(min=1)
    if mode == "seq_mean_token_sum_norm":
        return lengths / max(mask.numel(), 1)
    rows = (lengths > 0).float()
    if mode == "seq_mean_token_mean":
        return rows / rows.sum().clamp(min=1)
    if mode == "seq_mean_token_sum":
        return lengths / rows.sum().clamp(min=1)
    raise ValueError(f"loss_agg.mode={mode!r} is not valid (valid: {', '.join(MODES)})")
