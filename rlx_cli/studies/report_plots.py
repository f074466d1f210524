"""``rlx report --plots``: a PNG per metric, each arm's mean over seeds with a ±std band."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot_curves(arms: list, curves: dict, metrics: list[str], folder: Path, axis: str = "step") -> list[Path]:
    """One PNG per metric: per arm the mean over seeds at each x (``axis``: step, or a compute axis whose runs share
    the x of their evaluations), with a ±std band where n ≥ 2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    folder.mkdir(parents=True, exist_ok=True)
    styles, markers = ["-", "--", "-.", ":"], ["o", "s", "^", "D", "v", "P"]
    written = []
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=150)
        for i, arm in enumerate(arms):
            series = {r.info.run_id: dict(curves[r.info.run_id, metric]) for r in arm.runs}
            frame = pd.DataFrame(series).sort_index()
            if axis != "step":  # each run's x differ: every run interpolated at every x inside its own range
                frame = frame.interpolate(method="index", limit_area="inside")
            if frame.empty:
                continue
            mean, std = frame.mean(axis=1), frame.std(axis=1, ddof=1)
            color = plt.cm.tab10(i % 10)
            # arms that coincide stay visible: each its own dash pattern and marker
            ax.plot(mean.index, mean.values, color=color, linestyle=styles[i % len(styles)], linewidth=1.6,
                    marker=markers[i % len(markers)] if len(frame) <= 25 else None, markersize=4,
                    label=f"{arm.label} (n={frame.shape[1]})")  # fmt: skip
            if frame.shape[1] > 1:
                ax.fill_between(mean.index, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(axis if axis == "step" else f"{axis} (perf/{'wall_s' if axis == 'wall' else axis})")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric}: mean ± std over seeds", fontsize=11)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        outside = len(arms) > 4
        ax.legend(fontsize=8, frameon=False, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1)} if outside else {}))
        path = folder / f"{metric.replace('/', '_')}.png"
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
