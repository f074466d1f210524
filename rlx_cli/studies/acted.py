"""The ``acted`` column: did the ablated ingredient act here? The manipulation check beside an ablation's verdict.

An ablation (``+ablate=no_X``) switches one ingredient off; its verdict can only say something where the
ingredient had something to do. Each ingredient logs one figure every step (``components/acted.py``, defined in
docs/metrics.md, "Did it act"); a run's figure is the mean over its steps, an arm's the mean over its seeds. The
column puts the full preset's figure (the baseline's) beside the ablated arm's: clip-higher let 2.1% of tokens
through in the full preset and 0% without it, say, or λ spanned 0.90–0.99 against a fixed 0.95.
"""

from __future__ import annotations

import math

from rlx_cli.studies.comparison import mean

# ablation -> (its figure: a metric, or (a, b) for a − b; what the figure is, in words)
ACTED: dict[str, tuple[str | tuple[str, str], str]] = {
    "no_clip_higher": ("train/clip_higher_share", "tokens the higher clip let through"),
    "no_adaptive_gae": (("train/policy_lam_max", "train/policy_lam_min"), "spread of the per-row λ"),
    "no_value_pretrain": ("train/critic_first_token_bias", "critic's bias at the first token"),
    "no_decoupled_gae": ("train/critic_first_token_bias", "critic's bias at the first token"),
    "no_token_loss": ("train/long_quarter_weight", "loss weight on the longest quarter"),
    "no_positive_nll": ("train/nll_share", "positive NLL's share of the loss"),
    "no_group_sampling": ("train/prompts_per_update", "prompts an update sees"),
}
METRICS = tuple(sorted({m for figure, _ in ACTED.values() for m in ((figure,) if isinstance(figure, str) else figure)}))
FIGURES = tuple(f"{m} mean" for m in METRICS)  # a run's mean over its steps: the columns of a report's *-runs.csv


def figures(curves: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """One run's ``FIGURES`` from its step curves (metric -> [(step, value)]); NaN where it did not log one."""
    out = dict.fromkeys(FIGURES, math.nan)
    for metric, points in curves.items():
        if points and f"{metric} mean" in out:
            out[f"{metric} mean"] = sum(v for _, v in points) / len(points)
    return out


def figure(ablate: str, runs: list[dict[str, float]]) -> float:
    """The ablation's figure, mean over ``runs`` (each a run's ``figures``); NaN where none logged it."""
    metric = ACTED[ablate][0]
    pair = (metric, None) if isinstance(metric, str) else metric
    values = []
    for run in runs:
        value = run.get(f"{pair[0]} mean", math.nan) - (run.get(f"{pair[1]} mean", math.nan) if pair[1] else 0.0)
        if not math.isnan(value):
            values.append(value)
    return mean(values)


def cell(ablate: str, base: list[dict[str, float]], arm: list[dict[str, float]]) -> str:
    """ "<what>: <full preset's> → <the ablation's>" for an arm ``+ablate=<ablate>``, "" for any other arm."""
    if ablate not in ACTED:
        return ""
    full, without = figure(ablate, base), figure(ablate, arm)
    if math.isnan(full) and math.isnan(without):
        return ""
    return f"{ACTED[ablate][1]}: {shown(full)} → {shown(without)}"


def shown(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3g}"
