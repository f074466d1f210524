"""How ``rlx report`` prints its table (Markdown, CSV, LaTeX, HTML) and draws learning curves (PNG)."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

DASH = "–"


@dataclass
class Context:
    metric: str
    reduce: str  # how a run's history became one number, in words
    baseline: str
    common: str  # overrides shared by every arm
    source: str  # "experiment X · study Y"
    extras: list[str]
    minimize: bool = False


def num(x: float, scale: float | None = None) -> str:
    """3 decimals, or 3 significant figures below 0.001 and from 1000 on. ``scale``: the size of the column's
    means, which sets the format of a std, a Δ or a CI bound (a Δ of 0.0006 on accuracies prints 0.001)."""
    if x is None or math.isnan(x):
        return DASH
    size = abs(x) if scale is None or math.isnan(scale) else scale
    return f"{x:.3g}" if size != 0 and (size >= 1000 or size < 0.001) else f"{x:.3f}"


def mean_std(mean: float, std: float, scale: float | None = None) -> str:
    return f"{num(mean, scale)} ± {num(std, scale)}"


def signed(x: float, scale: float | None = None) -> str:
    return DASH if math.isnan(x) else ("+" if x >= 0 else "") + num(x, scale)


def p_value(p: float) -> str:
    return DASH if math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def cells(table: pd.DataFrame, ctx: Context) -> tuple[list[str], list[list[str]], list[int]]:
    """Headers, rows of display strings, and the row indices holding the best mean (to set in bold)."""
    headers = ["arm", ctx.metric, "n", "Δ"]
    has_stats = "p_value" in table.columns
    if has_stats:
        headers += ["p (Welch)", "95% CI of Δ (Welch)"]
    headers += ctx.extras
    rows = []
    scale = table["mean"].abs().max()
    extra_scales = {m: table[f"{m} mean"].abs().max() for m in ctx.extras}
    for i, row in table.iterrows():
        delta = "baseline" if i == 0 else signed(row["delta"], scale)
        line = [row["arm"], mean_std(row["mean"], row["std"], scale), str(row["n"]), delta]
        if has_stats:
            low, high = signed(row["ci_low"], scale), signed(row["ci_high"], scale)
            line += [p_value(row["p_value"]), DASH if math.isnan(row["ci_low"]) else f"[{low}, {high}]"]
        line += [mean_std(row[f"{m} mean"], row[f"{m} std"], extra_scales[m]) for m in ctx.extras]
        rows.append(line)
    means = table["mean"].dropna()
    best = [] if means.empty else list(table.index[table["mean"] == (means.min() if ctx.minimize else means.max())])
    return headers, rows, best


def caption(ctx: Context, n_arms: int) -> str:
    return (
        f"{ctx.metric} ({ctx.reduce} per run): mean ± std over seeds, {n_arms} arms, Δ vs {ctx.baseline}, best in bold"
    )


def footer(ctx: Context) -> str:
    parts = [ctx.source] if ctx.source else []
    if ctx.common:
        parts.append(f"common overrides: {ctx.common}")
    return " · ".join(parts)


def markdown(table: pd.DataFrame, ctx: Context) -> str:
    headers, rows, best = cells(table, ctx)
    for i in best:
        rows[i][1] = f"**{rows[i][1]}**"
    rows = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    align = ["left"] + ["right"] * (len(headers) - 1)
    body = pd.DataFrame(rows, columns=headers).to_markdown(index=False, disable_numparse=True, colalign=align)
    common = f"\n\n{footer(ctx)}" if footer(ctx) else ""
    return f"{caption(ctx, len(rows))}\n\n{body}{common}\n"


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    return re.sub(r"[\\&%$#_{}~^]", lambda m: LATEX_SPECIAL[m.group()], text)


def latex(table: pd.DataFrame, ctx: Context) -> str:
    headers, rows, best = cells(table, ctx)

    def cell(text: str) -> str:
        return latex_escape(text).replace("±", "$\\pm$").replace("Δ", "$\\Delta$").replace(DASH, "--")

    lines = [
        f"% {cell(caption(ctx, len(rows)))}",
        f"% {cell(footer(ctx))}" if footer(ctx) else None,
        "\\begin{tabular}{l" + "r" * (len(headers) - 1) + "}",
        "\\toprule",
        " & ".join(cell(h) for h in headers) + " \\\\",
        "\\midrule",
    ]
    for i, row in enumerate(rows):
        texts = [cell(c) for c in row]
        if i in best:
            texts[1] = f"\\textbf{{{texts[1]}}}"
        lines.append(" & ".join(texts) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(line for line in lines if line is not None) + "\n"


def html_table(table: pd.DataFrame, ctx: Context) -> str:
    headers, rows, best = cells(table, ctx)
    out = ["<table>", f"<caption>{html.escape(caption(ctx, len(rows)))}</caption>", "<thead><tr>"]
    out += [f"<th>{html.escape(h)}</th>" for h in headers] + ["</tr></thead>", "<tbody>"]
    for i, row in enumerate(rows):
        texts = [html.escape(c) for c in row]
        if i in best:
            texts[1] = f"<b>{texts[1]}</b>"
        out.append("<tr>" + "".join(f"<td>{t}</td>" for t in texts) + "</tr>")
    out += ["</tbody>", "</table>"]
    if footer(ctx):
        out.append(f"<p>{html.escape(footer(ctx))}</p>")
    return "\n".join(out) + "\n"


def csv(table: pd.DataFrame, ctx: Context) -> str:
    """Raw numbers: ``<metric>_mean``, ``<metric>_std`` (empty for n = 1), ``delta``, …; one row per arm."""
    renamed = {"mean": f"{ctx.metric}_mean", "std": f"{ctx.metric}_std"}
    renamed |= {f"{m} mean": f"{m}_mean" for m in ctx.extras} | {f"{m} std": f"{m}_std" for m in ctx.extras}
    return table.rename(columns=renamed).to_csv(index=False)


def render(table: pd.DataFrame, ctx: Context, fmt: str) -> str:
    return {"md": markdown, "csv": csv, "tex": latex, "html": html_table}[fmt](table, ctx)


def plot_curves(arms: list, curves: dict, metrics: list[str], folder: Path) -> list[Path]:
    """One PNG per metric: per arm the mean over seeds at each step, with a ±std band where n ≥ 2."""
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
        ax.set_xlabel("step")
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
