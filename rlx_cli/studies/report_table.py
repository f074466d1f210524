"""The numbers of ``rlx report``'s tables, from per-run records (``run_records``): one row per arm, the baseline first.

Each arm: n, mean ± std of its per-seed values, Δ vs the baseline; with ``--stats`` its verdict and what it rests on
(``stats.judge`` over the table's arms as one family: the paired or Welch t-test's p, TOST's p, both adjusted, the
interval that decided the label and its level, the detectable effect at the row's level, the seeds that would decide
an inconclusive arm or what holds it back); where the runs say, the evaluation's own standard error and the health
flags. The notes under the table list the flagged arms, the arms whose evaluation noise rivals their seed noise, and
what a second look at more seeds would cost.
"""

from __future__ import annotations

import math

import pandas as pd

from rlx_cli.studies import health, power, stats
from rlx_cli.studies.comparison import NAN, Comparison, compare, mean, std
from rlx_cli.studies.run_records import RunRecord, finished
from rlx_cli.studies.stats import Judging

NOISE_SHARE = 0.5  # evaluation noise at least this share of the between-seed spread of Δ: a note says what to raise
KNOBS = "task.eval_size (more prompts) or eval.samples (more answers a prompt, for the sampled accuracy)"


def known_lower_is_better(metric: str) -> bool:
    """Metrics whose direction is known to be down: losses, KLs and times (perf/*_s, but not rates: perf/*_per_s)."""
    name = metric.rsplit("/", 1)[-1]
    is_time = metric.startswith("perf/") and name.endswith("_s") and not name.endswith("_per_s")
    return "loss" in name or name.endswith("kl") or is_time


def mean_of(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return mean(finite)


def build_table(arms: list[tuple[str, str]], base: str, records: dict[str, list[RunRecord]], extras: list[str],
                judging: Judging | None) -> tuple[pd.DataFrame, list[str]]:  # fmt: skip
    """``arms``: (label, overrides) in order, ``records``: label -> its runs -> (the table, one row per arm with the
    baseline first, as every format prints it; the notes under it)."""
    reference = finished(records[base])
    ordered = [a for a in arms if a[0] == base] + [a for a in arms if a[0] != base]
    margin = (judging or Judging()).margin
    rows, comparisons, flagged, judged = [], {}, {}, False
    for label, overrides in ordered:
        runs = records[label]
        values = finished(runs)
        listed = list(values.values())
        row = {"arm": label, "n": len(values), "mean": mean(listed), "std": std(listed)}
        row["delta"] = row["mean"] - mean(list(reference.values())) if values and reference else NAN
        if label != base:
            comparisons[label] = compare(values, reference, margin=margin)
        row["eval_se"] = mean_of([r.se for r in runs if r.status == "FINISHED"])
        facts = [(r.seed, r.status, r.figures) for r in runs]
        judged |= health.judged(facts)
        flagged[label] = health.arm_flags(facts)
        row["health"] = health.cell(flagged[label], facts)
        for m in extras:
            listed = [r.extras[m] for r in runs if r.status == "FINISHED" and not math.isnan(r.extras[m])]
            row[f"{m} mean"], row[f"{m} std"] = mean(listed), std(listed)
        row["overrides"] = overrides
        rows.append(row)
    table = pd.DataFrame(rows)
    if judging:
        add_verdicts(table, comparisons, judging)
    if table["eval_se"].isna().all():  # runs from before evaluations logged their SE
        table = table.drop(columns="eval_se")
    if not judged:  # a *-runs.csv without the figures the flags read
        table = table.drop(columns="health")
    notes = health.listing(flagged) if judged else []
    return table, notes + noise_notes(table, comparisons) + ([SECOND_LOOK] if judging and comparisons else [])


SECOND_LOOK = (
    "these verdicts hold at the family-wise α for the seeds run here; adding seeds to these runs and judging again "
    "is a second look that α does not cover (false better/worse rise to 8.5-11.8% at α = 5%): run the seeds in "
    "brackets as a fresh study, or declare a study with looks (rlx sweep --plan FILE --until-decided)"
)
VERDICT_COLUMNS = ("test", "p_value", "p_holm", "p_equivalent", "p_equivalent_holm", "ci_low", "ci_high", "ci_level",
                   "detectable", "verdict", "within_margin", "seeds_needed", "why")  # fmt: skip


def add_verdicts(table: pd.DataFrame, comparisons: dict[str, Comparison], judging: Judging) -> None:
    """The table's verdicts (``stats.judge``: one family over its arms) as columns after Δ, in place."""
    verdicts = stats.judge({arm: (c, 0) for arm, c in comparisons.items()}, judging)
    columns = {name: [] for name in VERDICT_COLUMNS}
    for arm in table["arm"]:
        v, c = verdicts.get(arm), comparisons.get(arm)
        if v is None:  # the baseline
            for name, empty in zip(VERDICT_COLUMNS, ("", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, "", False, None, "")):
                columns[name].append(empty)
            continue
        detectable = power.detectable(c.se, c.df, level=v.judged_at) if c.testable else NAN
        for name, value in zip(VERDICT_COLUMNS, (c.test, v.p, v.p_adjusted, v.p_equivalent, v.p_equivalent_adjusted,
                                                 v.low, v.high, v.level, detectable, v.label, v.within, v.seeds_needed,
                                                 v.why)):  # fmt: skip
            columns[name].append(value)
    at = table.columns.get_loc("delta") + 1
    for offset, name in enumerate(VERDICT_COLUMNS):
        values = pd.array(columns[name], dtype="Int64") if name == "seeds_needed" else columns[name]
        table.insert(at + offset, name, values)


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
                judging: Judging) -> pd.DataFrame:  # fmt: skip
    """Per arm against the baseline: the pilot's n, test and spread, its detectable effect, the seeds Δ needs, both at
    the level the table's first step judges at (α over the arms compared)."""
    reference = finished(records[base])
    compared = [a for a in arms if a[0] != base]
    level = judging.alpha / max(1, len(compared))
    rows = []
    for label, overrides in compared:
        test = compare(finished(records[label]), reference, margin=judging.margin)
        planned = power.planned_variances(test.variances, test.df) if test.testable else ()
        rows.append({
            "arm": label, "n": test.n, "test": test.test, "sigma": test.sigma,
            "detectable": power.detectable(test.se, test.df, level=level) if test.testable else NAN,
            "seeds_needed": power.seeds_needed(delta, planned, alpha=level) if planned else None,
            "overrides": overrides,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "n", "test", "sigma", "detectable", "seeds_needed", "overrides"])
