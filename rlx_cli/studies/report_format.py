"""How ``rlx report`` prints its table (Markdown, CSV, LaTeX, HTML) and draws learning curves (PNG)."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field

import pandas as pd

from rlx_cli.studies.stats import Judging

DASH = "–"


@dataclass
class Context:
    metric: str
    reduce: str  # how a run's history became one number, in words
    baseline: str
    common: str  # overrides shared by every arm
    source: str  # "experiment X · study Y"
    extras: list[str]
    judging: Judging = field(default_factory=Judging)  # the verdicts' margin, level and direction
    described: dict[str, str] = field(default_factory=dict)  # legend of an extra column that is not a reduced metric
    axis: str = "step"  # the x of the curves: step | samples | tokens | wall (compute_axis.py)
    budget: str = ""  # on another axis than step: where every run's curve was cut, in words
    notes: list[str] = field(default_factory=list)  # under the table: the flagged arms, the evaluation's noise


def num(x: float, scale: float | None = None) -> str:
    """3 decimals; 3 significant figures below 0.001; in a column of values from 1000 on, whole numbers with
    thousands separators (2,005, not 2e+03) and 3 significant figures below 1000. ``scale``: the size of the
    column's means, which sets the format of a std, a Δ or a CI bound (a Δ of 0.0006 on accuracies prints 0.001)."""
    if x is None or math.isnan(x):
        return DASH
    size = abs(x) if scale is None or math.isnan(scale) else scale
    if size >= 1000:
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
    return f"{x:.3g}" if size != 0 and size < 0.001 else f"{x:.3f}"


def mean_std(mean: float, std: float, scale: float | None = None) -> str:
    """ "mean ± std"; "–" for an arm without the metric (a loss that does not log it)."""
    return DASH if mean is None or math.isnan(mean) else f"{num(mean, scale)} ± {num(std, scale)}"


def signed(x: float, scale: float | None = None) -> str:
    return DASH if math.isnan(x) else ("+" if x >= 0 else "") + num(x, scale)


def p_value(p: float, alpha: float) -> str:
    """3 decimals, with more where rounding would carry p across α (0.0497 at α = 0.05, not 0.050)."""
    if math.isnan(p):
        return DASH
    if p < 0.001:
        return "<0.001"
    shown = f"{p:.3f}"
    return f"{p:.4g}" if (float(shown) < alpha) != (p < alpha) else shown


@dataclass
class Layout:
    """A table as display strings, whatever its format: caption, header, rows, notes and a legend under it."""

    caption: str
    headers: list[str]
    rows: list[list[str]]
    bold: list[int]  # rows whose second cell (the metric) is set in bold
    notes: list[str]  # lines under the table: where the runs came from, the common overrides, totals
    legend: list[tuple[str, str]]  # (column, what it is), one per column


TESTS = (
    "paired: a t-test on the per-seed differences (both arms ran the same seeds, and a seed fixes the prompts "
    "and the random draws); Welch: an unequal-variance t-test, where the seeds differ (--seeds with the "
    "seeds they share makes it paired)"
)


def ablation(table: pd.DataFrame, ctx: Context) -> Layout:
    """The ablation table: one row per arm, the baseline first; with ``--stats`` each arm's test and verdict against
    it; the evaluation's SE and the health flags where the runs say."""
    alpha, margin, scale = ctx.judging.alpha, ctx.judging.margin, table["mean"].abs().max()
    headers = ["arm", ctx.metric, "n", "Δ"]
    legend = [
        ("arm", "the algorithm, its ablation and the overrides that differ between arms"),
        (ctx.metric, f"{ctx.reduce} per run, mean ± sample std over the arm's seeds; the best in bold"),
        ("n", "seeds (one run each)"),
        ("Δ", f"the arm's mean - the baseline's ({ctx.baseline})"),
    ]
    has_stats = "p_value" in table.columns
    looks = "decided_at" in table.columns
    if has_stats:
        compared = int(table["p_value"].notna().sum())
        headers += ["test", "p", "p (Holm)", "TOST p (Holm)", "interval of Δ", "level", "MDE (80%)", "verdict"]
        headers += ["decided at"] if looks else []
        legend += [
            ("test", TESTS),
            ("p", "two-sided p-value of that test for Δ = 0" + (", at the arm's last look" if looks else "")),
            ("p (Holm)", f"p adjusted for the table: Holm's step-down over the {2 * compared} hypotheses of the "
                         f"{compared} arm{'s' * (compared != 1)} compared (Δ = 0 and |Δ| >= δ each), with Shaffer's "
                         "restriction that at most one of an arm's two is true; the table's verdicts together hold a "
                         f"family-wise error of {100 * alpha:g}%"),
            ("TOST p (Holm)", f"TOST's p (the larger of the two one-sided tests of Δ <= -{num(margin, scale)} and "
                              f"Δ >= +{num(margin, scale)}), adjusted in the same family"),
            ("interval of Δ", "the t interval of Δ that decided the verdict, at the level beside it: for better, "
                              "worse and inconclusive the two-sided interval at the level the row's test was judged "
                              "at (it leaves out 0 exactly when the row is better or worse), for equivalent TOST's "
                              "interval (inside ±δ)"),
            ("level", f"that interval's confidence: 1 - α/t for a difference, 1 - 2α/t for TOST, t the arms Holm's "
                      f"step still counted (1 - α = {100 * (1 - alpha):g}% when no other arm is compared)"),
            ("MDE (80%)", "minimum detectable effect: the |Δ| the row's test finds with 80% power at the level it was "
                          "judged at, for the arm's n and the spread seen; a smaller true Δ likely goes unnoticed"),
            ("verdict", verdict_legend(ctx.judging, scale)),
        ]  # fmt: skip
        if looks:
            legend.append(("decided at", "the look at which the arm was decided, with the seeds an arm had run then; "
                                         "a decided arm runs no more seeds; its Δ, test and interval are of those "
                                         "seeds (a study judged at several looks holds each look's test to the "
                                         "boundary of its level: no adjusted p, and the interval at that "
                                         "boundary)"))  # fmt: skip
    if "eval_se" in table.columns:
        headers.append("eval SE")
        legend.append(("eval SE", f"the evaluation's own standard error of {ctx.metric} (over its prompts; with "
                                  "several answers a prompt, clustered by prompt), mean over the arm's runs: the "
                                  "noise a run's figure carries from the finite evaluation alone"))  # fmt: skip
    if "health" in table.columns:
        headers.append("health")
        legend.append(("health", "ok, or the flags the arm's runs raise (collapsed, diverged, entropy-collapse, "
                                 "drift: docs/studies-and-reports.md, Reading a verdict); the flagged arms are listed "
                                 "under the table with their figures"))  # fmt: skip
    if "acted" in table.columns:
        headers.append("acted")
        legend.append(("acted", "did the ablated ingredient act here? Its own figure (docs/metrics.md, Did it act) in "
                                "the full preset → in the ablation, each the mean over the run's steps and the arm's "
                                "seeds"))  # fmt: skip
    headers += ctx.extras
    legend += [(m, ctx.described.get(m, f"{ctx.reduce} per run, mean ± sample std over seeds")) for m in ctx.extras]
    rows = []
    extra_scales = {m: table[f"{m} mean"].abs().max() for m in ctx.extras}
    for i, row in table.iterrows():
        delta = "baseline" if i == 0 else signed(row["delta"], scale)
        line = [row["arm"], mean_std(row["mean"], row["std"], scale), str(row["n"]), delta]
        if has_stats:
            low, high = signed(row["ci_low"], scale), signed(row["ci_high"], scale)
            interval = DASH if math.isnan(row["ci_low"]) else f"[{low}, {high}]"
            test = row["test"] or (DASH if i else "")
            ps = [p_value(row[name], alpha) for name in ("p_value", "p_holm", "p_equivalent_holm")]
            line += [test, *ps, interval, percent(row["ci_level"]), num(row["detectable"], scale)]
            line.append(verdict_cell(row))
            line += [row["decided_at"]] if looks else []
        if "eval_se" in table.columns:
            line.append(num(row["eval_se"], scale))
        if "health" in table.columns:
            line.append(row["health"])
        if "acted" in table.columns:
            line.append(row["acted"])
        line += [mean_std(row[f"{m} mean"], row[f"{m} std"], extra_scales[m]) for m in ctx.extras]
        rows.append(line)
    means = table["mean"].dropna()
    lower = ctx.judging.lower_is_better
    best = [] if means.empty else list(table.index[table["mean"] == (means.min() if lower else means.max())])
    judged = (
        f"; verdicts at α = {alpha:g} against a margin δ = {num(margin, scale)} in {ctx.metric}'s units, "
        f"{'lower' if lower else 'higher'} is better"
        if has_stats
        else ""
    )
    caption = (
        f"{ctx.metric} ({ctx.reduce} per run): mean ± std over seeds, {len(rows)} arms, Δ vs {ctx.baseline}, "
        "best in bold" + judged + (f"; {ctx.budget}" if ctx.budget else "")
    )
    if has_stats and looks and table["p_holm"].isna().all():  # judged at several looks: boundaries, not adjusted p
        for name in ("p (Holm)", "TOST p (Holm)", "MDE (80%)"):
            at = headers.index(name)
            headers.pop(at)
            for line in rows:
                line.pop(at)
        legend = [entry for entry in legend if entry[0] not in ("p (Holm)", "TOST p (Holm)", "MDE (80%)")]
    return Layout(caption, headers, rows, best, footer(ctx) + ctx.notes, legend)


def verdict_legend(judging: Judging, scale: float) -> str:
    alpha, margin = judging.alpha, num(judging.margin, scale)
    better = "lower" if judging.lower_is_better else "higher"
    return (
        f"better / worse: the row's test rejects Δ = 0 in the table's family at α = {alpha:g} ({better} is better); "
        f'"within δ" beside it: TOST passes too, a difference smaller than ±{margin}; equivalent: TOST rejects '
        f"|Δ| >= {margin} in the family; identical: no spread and Δ = 0 on every seed (no test needed); "
        'inconclusive: neither, which is not "no effect": in brackets the seeds per arm with which a fresh study '
        "decides it with 80% power at the level this row was judged at (the t-test at the pilot's Δ, or TOST where "
        "|Δ| < δ; from the 70% upper confidence bound of the spread), or what holds it back; a health flag sits "
        "beside the verdict, it does not change it"
    )


def verdict_cell(row) -> str:
    label = row["verdict"]
    if label in ("better", "worse") and row["within_margin"]:
        return f"{label} (within δ)"
    if label != "inconclusive":
        return label or ""
    needed = row["seeds_needed"]
    if not pd.isna(needed):
        return f"inconclusive ({int(needed):,} seeds)"
    return f"inconclusive ({row['why']})" if row["why"] else "inconclusive"


def percent(level: float) -> str:
    """A confidence as a percentage, with the digits it needs (95%, 98.75%)."""
    return DASH if math.isnan(level) else f"{100 * level:.4g}%"


def planning(table: pd.DataFrame, ctx: Context, delta: float) -> Layout:
    """``--power Δ``: per arm the pilot's test and spread, its detectable effect and the seeds Δ needs."""
    scale = max(abs(delta), table["detectable"].abs().max() if len(table) else 0)
    target = num(delta, scale)
    alpha = ctx.judging.alpha
    headers = ["arm", "n", "test", "σ of a one-seed Δ", "MDE (80%) now", f"seeds for Δ = {target}"]
    rows = [
        [row["arm"], str(row["n"]), row["test"] or DASH, num(row["sigma"], scale), num(row["detectable"], scale),
         seeds(row["seeds_needed"], row["test"])]
        for _, row in table.iterrows()
    ]  # fmt: skip
    legend = [
        ("arm", "the algorithm, its ablation and the overrides that differ between arms"),
        ("n", "seeds this study ran (the pilot)"),
        ("test", TESTS),
        ("σ of a one-seed Δ", "the standard deviation of the per-seed differences (paired) or "
                              "sqrt(s_arm² + s_baseline²) (Welch): the noise a seed adds to Δ"),
        ("MDE (80%) now", f"the |Δ| the pilot's n finds with 80% power at α / {max(1, len(table))} = "
                          f"{alpha / max(1, len(table)):.3g}, the level of the table's first step"),
        (f"seeds for Δ = {target}", f"the fewest seeds per arm with which that test finds |Δ| = {target} with 80% "
                                    "power at that level (two-sided), from the 70% upper confidence bound of the "
                                    "pilot's spread"),
    ]  # fmt: skip
    needed = [int(n) for n in table["seeds_needed"].dropna()] if len(table) else []
    notes = footer(ctx)
    if needed:
        notes.append(f"every arm: {max(needed)} seeds each (the most any arm needs)")
    caption = (
        f"seeds needed to detect |Δ| = {target} in {ctx.metric} ({ctx.reduce} per run) vs {ctx.baseline}, "
        "from this study's spread"
    )
    return Layout(caption, headers, rows, [], notes, legend)


def seeds(needed: float | None, test: str) -> str:
    if needed is None or (isinstance(needed, float) and math.isnan(needed)):
        return DASH if not test else "> 100,000"
    return f"{int(needed):,}"


def footer(ctx: Context) -> list[str]:
    parts = [ctx.source] if ctx.source else []
    if ctx.common:
        parts.append(f"common overrides: {ctx.common}")
    return [" · ".join(parts)] if parts else []


def markdown(layout: Layout) -> str:
    rows = [list(row) for row in layout.rows]
    for i in layout.bold:
        rows[i][1] = f"**{rows[i][1]}**"
    rows = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    align = ["left"] + ["right"] * (len(layout.headers) - 1)
    body = pd.DataFrame(rows, columns=layout.headers).to_markdown(index=False, disable_numparse=True, colalign=align)
    notes = "".join(f"\n\n{line}" for line in layout.notes)
    legend = "\n".join(f"- {column}: {meaning}" for column, meaning in layout.legend)
    return f"{layout.caption}\n\n{body}{notes}\n\nColumns:\n\n{legend}\n"


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    return re.sub(r"[\\&%$#_{}~^]", lambda m: LATEX_SPECIAL[m.group()], text)


def latex(layout: Layout) -> str:
    def cell(text: str) -> str:
        return latex_escape(text).replace("±", "$\\pm$").replace("Δ", "$\\Delta$").replace(DASH, "--")

    lines = [
        f"% {cell(layout.caption)}",
        *(f"% {cell(line)}" for line in layout.notes),
        "\\begin{tabular}{l" + "r" * (len(layout.headers) - 1) + "}",
        "\\toprule",
        " & ".join(cell(h) for h in layout.headers) + " \\\\",
        "\\midrule",
    ]
    for i, row in enumerate(layout.rows):
        texts = [cell(c) for c in row]
        if i in layout.bold:
            texts[1] = f"\\textbf{{{texts[1]}}}"
        lines.append(" & ".join(texts) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    lines += [f"% {cell(column)}: {cell(meaning)}" for column, meaning in layout.legend]
    return "\n".join(lines) + "\n"


def html_table(layout: Layout) -> str:
    out = ["<table>", f"<caption>{html.escape(layout.caption)}</caption>", "<thead><tr>"]
    out += [f"<th>{html.escape(h)}</th>" for h in layout.headers] + ["</tr></thead>", "<tbody>"]
    for i, row in enumerate(layout.rows):
        texts = [html.escape(c) for c in row]
        if i in layout.bold:
            texts[1] = f"<b>{texts[1]}</b>"
        out.append("<tr>" + "".join(f"<td>{t}</td>" for t in texts) + "</tr>")
    out += ["</tbody>", "</table>"]
    out += [f"<p>{html.escape(line)}</p>" for line in layout.notes]
    out += ["<dl>", *(f"<dt>{html.escape(c)}</dt><dd>{html.escape(m)}</dd>" for c, m in layout.legend), "</dl>"]
    return "\n".join(out) + "\n"


def csv(table: pd.DataFrame, ctx: Context) -> str:
    """Raw numbers: ``<metric>_mean``, ``<metric>_std`` (empty for n = 1), ``delta``, …; one row per arm."""
    renamed = {"mean": f"{ctx.metric}_mean", "std": f"{ctx.metric}_std"}
    renamed |= {f"{m} mean": f"{m}_mean" for m in ctx.extras} | {f"{m} std": f"{m}_std" for m in ctx.extras}
    return table.rename(columns=renamed).to_csv(index=False)


WRITERS = {"md": markdown, "tex": latex, "html": html_table}


def render(table: pd.DataFrame, ctx: Context, fmt: str) -> str:
    return csv(table, ctx) if fmt == "csv" else WRITERS[fmt](ablation(table, ctx))


def render_power(table: pd.DataFrame, ctx: Context, delta: float, fmt: str) -> str:
    return table.to_csv(index=False) if fmt == "csv" else WRITERS[fmt](planning(table, ctx, delta))


def render_plan_seeds(table: pd.DataFrame, ctx: Context, fmt: str) -> str:
    return table.to_csv(index=False) if fmt == "csv" else WRITERS[fmt](seed_plan(table, ctx))


def seed_plan(table: pd.DataFrame, ctx: Context) -> Layout:
    """``--plan-seeds``: per arm of a pilot, the seeds a fixed design and the sequential design need to decide it."""
    scale, alpha, margin = table["sigma"].abs().max() if len(table) else 1.0, ctx.judging.alpha, ctx.judging.margin
    looks, seconds = table.attrs.get("looks", ()), table.attrs.get("seconds", math.nan)
    arms = max(1, len(table))
    headers = ["arm", "n", "test", "Δ", "σ of a one-seed Δ", "fixed: seeds to decide", "sequential: mean seeds"]
    rows = [[row["arm"], str(row["n"]), row["test"] or DASH, signed(row["delta"], scale), num(row["sigma"], scale),
             seeds(row["fixed_seeds"], row["test"]) if row["sigma"] > 0 else "– (no spread)",
             DASH if math.isnan(row["sequential_seeds"]) else f"{row['sequential_seeds']:.1f}"]
            for _, row in table.iterrows()]  # fmt: skip
    legend = [
        ("arm", "the algorithm, its ablation and the overrides that differ between arms"),
        ("n", "seeds this study ran (the pilot)"),
        ("test", TESTS),
        ("Δ", "the pilot's Δ, which the plans take as true"),
        ("σ of a one-seed Δ", "the pilot's spread of a one-seed Δ"),
        ("fixed: seeds to decide", f"a fresh fixed study's seeds an arm to decide it (better, worse or equivalent "
                                   f"within ±{num(margin, scale)}) with 80% power at α/{arms} = {alpha / arms:.3g}, "
                                   "from the 70% upper confidence bound of the pilot's variance"),
        ("sequential: mean seeds", f"the seeds the arm runs on average under looks at {', '.join(map(str, looks))} "
                                   f"seeds (Pocock-type spending; simulated from the pilot's Δ and the same bound "
                                   "of σ, 400 studies)"),
    ]  # fmt: skip
    notes = footer(ctx)
    fixed, mean_seeds = table["fixed_seeds"].max(), table["sequential_seeds"]
    if not math.isnan(seconds) and len(table):
        runs_fixed = fixed * (arms + 1)
        runs_sequential = mean_seeds.sum() + mean_seeds.max()
        notes.append(f"at the pilot's {seconds:.0f} s a run: a fixed design of {seeds(fixed, 'x')} seeds an arm runs "
                     f"{runs_fixed:,.0f} runs ({runs_fixed * seconds / 3600:.1f} h on one slot); the sequential "
                     f"design about {runs_sequential:,.0f} ({runs_sequential * seconds / 3600:.1f} h): divide by "
                     "--jobs")  # fmt: skip
    caption = f"seeds to decide each arm in {ctx.metric} ({ctx.reduce} per run) vs {ctx.baseline}, from this pilot"
    return Layout(caption, headers, rows, [], notes, legend)
