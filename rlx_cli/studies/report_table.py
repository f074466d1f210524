"""The numbers of ``rlx report``'s tables, from per-run records (``run_records``): one row per arm, the baseline first.

Each arm: n, mean ± std of its per-seed values, Δ vs the baseline; with ``--stats`` the paired or Welch t-test, its
interval, p and Holm's p, the detectable effect, TOST's p against the margin and Holm's, and the verdict
(``stats.label`` on the Holm-adjusted p-values, the seeds that would decide an inconclusive arm); where the runs say,
the evaluation's own standard error and the health flags. The notes under the table list the flagged arms and the
arms whose evaluation noise rivals their seed noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from rlx_cli.studies import health, stats
from rlx_cli.studies.run_records import RunRecord, finished

NOISE_SHARE = 0.5  # evaluation noise at least this share of the between-seed spread of Δ: a note says what to raise
KNOBS = "task.eval_size (more prompts) or eval.samples (more answers a prompt, for the sampled accuracy)"


@dataclass(frozen=True)
class Judging:
    """How ``--stats`` judges an arm: at level ``alpha`` against a ``margin`` in the metric's units."""

    margin: float = 0.02
    alpha: float = stats.ALPHA
    lower_is_better: bool = False


def known_lower_is_better(metric: str) -> bool:
    """Metrics whose direction is known to be down: losses, KLs and times (perf/*_s)."""
    name = metric.rsplit("/", 1)[-1]
    return "loss" in name or name.endswith("kl") or (metric.startswith("perf/") and name.endswith("_s"))


def mean_of(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return stats.mean(finite)


def build_table(arms: list[tuple[str, str]], base: str, records: dict[str, list[RunRecord]], extras: list[str],
                judging: Judging | None) -> tuple[pd.DataFrame, list[str]]:  # fmt: skip
    """``arms``: (label, overrides) in order, ``records``: label -> its runs -> (the table, one row per arm with the
    baseline first, as every format prints it; the notes under it)."""
    reference = finished(records[base])
    ordered = [a for a in arms if a[0] == base] + [a for a in arms if a[0] != base]
    rows, comparisons, flagged, judged = [], {}, {}, False
    for label, overrides in ordered:
        runs = records[label]
        values = finished(runs)
        listed = list(values.values())
        row = {"arm": label, "n": len(values), "mean": stats.mean(listed), "std": stats.std(listed)}
        row["delta"] = row["mean"] - stats.mean(list(reference.values())) if values and reference else stats.NAN
        if label != base:
            level = 1 - (judging.alpha if judging else stats.ALPHA)
            comparisons[label] = stats.compare(values, reference, level=level)
        if judging:
            test = comparisons.get(label)
            row["test"] = test.test if test else ""
            row["p_value"] = test.p if test else stats.NAN
            row["ci_low"], row["ci_high"] = (test.low, test.high) if test else (stats.NAN, stats.NAN)
            row["detectable"] = test.detectable if test else stats.NAN
            row["p_equivalent"] = stats.equivalence_p(test, judging.margin) if test else stats.NAN
        row["eval_se"] = mean_of([r.se for r in runs if r.status == "FINISHED"])
        facts = [(r.seed, r.status, r.figures) for r in runs]
        judged |= health.judged(facts)
        flagged[label] = health.arm_flags(facts)
        row["health"] = ", ".join(flagged[label]) or "ok"
        for m in extras:
            listed = [r.extras[m] for r in runs if r.status == "FINISHED" and not math.isnan(r.extras[m])]
            row[f"{m} mean"], row[f"{m} std"] = stats.mean(listed), stats.std(listed)
        row["overrides"] = overrides
        rows.append(row)
    table = pd.DataFrame(rows)
    if judging:
        judge(table, comparisons, judging)
    if table["eval_se"].isna().all():  # runs from before evaluations logged their SE
        table = table.drop(columns="eval_se")
    if not judged:  # a *-runs.csv without the figures the flags read
        table = table.drop(columns="health")
    notes = health.listing(flagged) if judged else []
    return table, notes + noise_notes(table, comparisons)


def judge(table: pd.DataFrame, comparisons: dict[str, stats.Comparison], judging: Judging) -> None:
    """Holm over the table's arms, for p and TOST's p; then each arm's verdict and, if inconclusive, its seeds."""
    table.insert(table.columns.get_loc("p_value") + 1, "p_holm", stats.holm(table["p_value"].tolist()))
    adjusted = stats.holm(table["p_equivalent"].tolist())
    table.insert(table.columns.get_loc("p_equivalent") + 1, "p_equivalent_holm", adjusted)
    verdicts, needed = [], []
    for _, row in table.iterrows():
        test = comparisons.get(row["arm"])
        if test is None:  # the baseline
            verdicts.append("")
            needed.append(None)
            continue
        said = stats.label(row["delta"], row["p_holm"], row["p_equivalent_holm"], alpha=judging.alpha,
                           lower_is_better=judging.lower_is_better)  # fmt: skip
        verdicts.append(said)
        decide = said == "inconclusive" and test.test
        needed.append(stats.deciding_seeds(test, judging.margin, alpha=judging.alpha) if decide else None)
    at = table.columns.get_loc("p_equivalent_holm") + 1
    table.insert(at, "verdict", verdicts)
    table.insert(at + 1, "seeds_needed", pd.array(needed, dtype="Int64"))


def noise_notes(table: pd.DataFrame, comparisons: dict[str, stats.Comparison]) -> list[str]:
    """A note when an arm's evaluation noise, sqrt(eval SE_arm² + eval SE_base²) for a one-seed Δ, is at least
    ``NOISE_SHARE`` of the spread of Δ between seeds (``Comparison.sigma``): more seeds then sharpen Δ less than a
    larger evaluation would."""
    if "eval_se" not in table.columns:
        return []
    base_se, noisy = table["eval_se"].iloc[0], []
    for _, row in table.iloc[1:].iterrows():
        sigma, noise = comparisons[row["arm"]].sigma, math.hypot(row["eval_se"], base_se)
        if sigma > 0 and noise >= NOISE_SHARE * sigma:  # NaN (one seed, no SE) compares false
            noisy.append(f"{row['arm']}: {noise:.3g} against {sigma:.3g}")
    if not noisy:
        return []
    return [f"evaluation noise: the evaluation's own SE of a one-seed Δ is at least {NOISE_SHARE:g} of the spread of Δ "
            f"between seeds for {'; '.join(noisy)}: the seeds' differences are partly the evaluation's; raise "
            f"{KNOBS}"]  # fmt: skip


def power_table(arms: list[tuple[str, str]], base: str, records: dict[str, list[RunRecord]], delta: float,
                alpha: float = stats.ALPHA) -> pd.DataFrame:  # fmt: skip
    """Per arm against the baseline: the pilot's n, test and spread, its detectable effect, the seeds Δ needs."""
    reference = finished(records[base])
    rows = []
    for label, overrides in [a for a in arms if a[0] != base]:
        values = finished(records[label])
        test = stats.compare(values, reference, level=1 - alpha)
        needed = stats.seeds_needed(delta, test.variances, alpha=alpha) if test.test else None
        rows.append({
            "arm": label, "n": len(values), "test": test.test, "sigma": test.sigma,
            "detectable": test.detectable, "seeds_needed": needed, "overrides": overrides,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "n", "test", "sigma", "detectable", "seeds_needed", "overrides"])
