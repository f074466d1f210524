"""``rlx report --fit entropy``: the law R = −a·exp(H) + b between policy entropy H and performance R.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (arXiv
2505.22617), fit it across training checkpoints. The model is linear in x = exp(H), so ordinary least squares has
a closed form: slope = Σ(x − x̄)(R − R̄) / Σ(x − x̄)², a = −slope, b = R̄ + a·x̄, R² = 1 − SS_res / SS_tot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlx_cli.config.errors import UserError
from rlx_cli.studies.runs import connect, histories

ENTROPY = "train/entropy"


@dataclass(frozen=True)
class EntropyFit:
    a: float
    b: float
    r2: float  # NaN when every R is the same (SS_tot = 0)
    n: int  # (entropy, reward) pairs fitted

    def predict(self, entropy: float) -> float:
        return -self.a * math.exp(entropy) + self.b


def fit_entropy_law(entropy: Sequence[float], reward: Sequence[float]) -> EntropyFit:
    """Least-squares fit of R = −a·exp(H) + b to paired ``entropy`` and ``reward`` values -> a, b, R², n.

    Needs at least two pairs with different entropies (else the slope is undefined: ``ValueError``).
    """
    if len(entropy) != len(reward):
        raise ValueError(f"entropy and reward differ in length ({len(entropy)} and {len(reward)})")
    n = len(entropy)
    x = [math.exp(h) for h in entropy]
    if n < 2 or max(x) == min(x):
        raise ValueError(f"fitting R = -a*exp(H) + b needs two or more pairs with different entropies (got {n})")
    x_mean, r_mean = sum(x) / n, sum(reward) / n
    sxx = sum((xi - x_mean) ** 2 for xi in x)
    sxr = sum((xi - x_mean) * (ri - r_mean) for xi, ri in zip(x, reward))
    a = -sxr / sxx
    b = r_mean + a * x_mean
    ss_res = sum((ri - (b - a * xi)) ** 2 for xi, ri in zip(x, reward))
    ss_tot = sum((ri - r_mean) ** 2 for ri in reward)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return EntropyFit(a=a, b=b, r2=r2, n=n)


def paired(entropy: list[tuple[int, float]], metric: list[tuple[int, float]]) -> tuple[list[float], list[float]]:
    """Two metric histories ``[(step, value)]`` -> the (entropy, metric) values at the steps both have."""
    at = dict(entropy)
    pairs = [(at[step], value) for step, value in metric if step in at]
    return [h for h, _ in pairs], [r for _, r in pairs]


def fit_report(arms: list, metric: str, known: list[str], plots: Path | None) -> str:
    """Per arm, the law fitted to the (``train/entropy``, ``metric``) pairs of all its runs (seeds pooled) -> a
    markdown table; with ``plots``, a PNG of the points and the fitted curves (``entropy_fit.png``)."""
    if ENTROPY not in known:
        raise UserError(f"--fit entropy needs '{ENTROPY}' in the runs (found: {', '.join(known)})")
    _, client = connect()
    curves = histories(client, [r for a in arms for r in a.runs], [ENTROPY, metric])
    rows, points = [], {}
    for arm in arms:
        h, r = [], []
        for run in arm.runs:
            more_h, more_r = paired(curves[run.info.run_id, ENTROPY], curves[run.info.run_id, metric])
            h, r = h + more_h, r + more_r
        try:
            fit = fit_entropy_law(h, r)
        except ValueError:
            fit = None
        points[arm.label] = (h, r, fit)
        cells = [f"{fit.a:.4g}", f"{fit.b:.4g}", f"{fit.r2:.3f}"] if fit else ["–", "–", "–"]
        rows.append(f"| {arm.label} | {len(arm.runs)} | {len(h)} | " + " | ".join(cells) + " |")
    if plots is not None:
        print(f"wrote {plot_fits(points, metric, plots)}", flush=True)
    head = (
        f"R = -a·exp(H) + b, H = {ENTROPY}, R = {metric}: least squares over the steps where both were logged, "
        "the seeds of an arm pooled (Cui et al. 2025)\n\n"
        "| arm | runs | pairs | a | b | R² |\n| --- | --- | --- | --- | --- | --- |"
    )
    return "\n".join([head, *rows]) + "\n"


def plot_fits(points: dict, metric: str, folder: Path) -> Path:
    """Scatter of (H, R) per arm with its fitted curve -> ``folder/entropy_fit.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=150)
    for i, (label, (h, r, fit)) in enumerate(points.items()):
        color = plt.cm.tab10(i % 10)
        ax.scatter(h, r, s=12, color=color, alpha=0.6, label=label)
        if fit is not None:
            grid = [min(h) + (max(h) - min(h)) * j / 99 for j in range(100)]
            ax.plot(grid, [fit.predict(x) for x in grid], color=color, linewidth=1.4,
                    label=f"a={fit.a:.3g}, b={fit.b:.3g}, R²={fit.r2:.2f}")  # fmt: skip
    ax.set_xlabel(f"{ENTROPY} (H)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs entropy: R = -a·exp(H) + b", fontsize=11)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))
    path = folder / "entropy_fit.png"
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
