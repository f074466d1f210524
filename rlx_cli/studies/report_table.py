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
from dataclasses import replace

import pandas as pd

from rlx_cli.studies import acted, health, power, sequential, stats, study_plan
from rlx_cli.studies.arms import ablation_of
from rlx_cli.studies.comparison import NAN, Comparison, compare, mean, std
from rlx_cli.studies.run_records import RunRecord, finished
from rlx_cli.studies.stats import Judging
from rlx_cli.studies.study_plan import StudyPlan

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
                judging: Judging | None, plan: StudyPlan | None = None) -> tuple[pd.DataFrame, list[str]]:  # fmt: skip
    """``arms``: (label, overrides) in order, ``records``: label -> its runs -> (the table, one row per arm with the
    baseline first, as every format prints it; the notes under it). A declared study (``plan``) is judged look by
    look (``sequential``)."""
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
    design: list[str] = []
    if judging and plan:
        state = sequential.replay(seed_values(records), plan, lower_is_better=judging.lower_is_better)
        verdicts = {arm: s.verdict for arm, s in state.arms.items() if arm in comparisons}
        comparisons = {arm: v.comparison for arm, v in verdicts.items() if v.comparison is not None}
        add_verdicts(table, comparisons, judging, verdicts)
        for i, arm in enumerate(table["arm"]):  # Δ on the seeds the arm was judged on (it may have run fewer)
            if arm in verdicts and not math.isnan(verdicts[arm].delta):
                table.loc[i, "delta"] = verdicts[arm].delta
        if len(plan.looks) > 1:
            add_looks(table, state, plan)
        design = design_notes(state, plan, judging)
    elif judging:
        add_verdicts(table, comparisons, judging)
    if table["eval_se"].isna().all():  # runs from before evaluations logged their SE
        table = table.drop(columns="eval_se")
    if not judged:  # a *-runs.csv without the figures the flags read
        table = table.drop(columns="health")
    add_acted(table, ordered, base, records)
    notes = health.listing(flagged) if judged else []
    second_look = [SECOND_LOOK] if judging and comparisons and not plan else []
    return table, design + notes + noise_notes(table, comparisons) + second_look


SECOND_LOOK = (
    "these verdicts hold at the family-wise α for the seeds run here; adding seeds to these runs and judging again "
    "is a second look that α does not cover (false better/worse rise to 8.5-11.8% at α = 5%): run the seeds in "
    "brackets as a fresh study, or declare a study with looks (rlx sweep --plan FILE --until-decided)"
)
VERDICT_COLUMNS = ("test", "p_value", "p_holm", "p_equivalent", "p_equivalent_holm", "ci_low", "ci_high", "ci_level",
                   "detectable", "verdict", "within_margin", "seeds_needed", "why")  # fmt: skip


def add_verdicts(table: pd.DataFrame, comparisons: dict[str, Comparison], judging: Judging,
                 verdicts: dict[str, stats.Verdict] | None = None) -> None:  # fmt: skip
    """The table's verdicts (``stats.judge``: one family over its arms, unless given) as columns after Δ, in
    place."""
    if verdicts is None:
        verdicts = stats.judge({arm: (c, 0) for arm, c in comparisons.items()}, judging)
    columns = {name: [] for name in VERDICT_COLUMNS}
    for arm in table["arm"]:
        v, c = verdicts.get(arm), comparisons.get(arm)
        if v is None:  # the baseline
            for name, empty in zip(VERDICT_COLUMNS, ("", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, "", False, None, "")):
                columns[name].append(empty)
            continue
        testable = c is not None and c.testable and not math.isnan(v.judged_at)
        detectable = power.detectable(c.se, c.df, level=v.judged_at) if testable else NAN
        values = (c.test if c else "", v.p, v.p_adjusted, v.p_equivalent, v.p_equivalent_adjusted, v.low, v.high,
                  v.level, detectable, v.label, v.within, v.seeds_needed, v.why)  # fmt: skip
        for name, value in zip(VERDICT_COLUMNS, values):
            columns[name].append(value)
    at = table.columns.get_loc("delta") + 1
    for offset, name in enumerate(VERDICT_COLUMNS):
        values = pd.array(columns[name], dtype="Int64") if name == "seeds_needed" else columns[name]
        table.insert(at + offset, name, values)


def add_acted(table: pd.DataFrame, arms: list[tuple[str, str]], base: str, records: dict[str, list[RunRecord]]):
    """The ``acted`` column (``acted.py``) where an ablation's runs or the baseline's logged its figure, in place."""
    done = {label: [r.acted for r in records[label] if r.status == "FINISHED"] for label, _ in arms}
    cells = [acted.cell(ablation_of(overrides.split()), done[base], done[label]) for label, overrides in arms]
    if any(cells):
        table.insert(table.columns.get_loc("overrides"), "acted", cells)


def seed_values(records: dict[str, list[RunRecord]]) -> dict[str, dict[int, float]]:
    """label -> {seed: value} of the FINISHED runs with a value and a seed that is a number."""
    return {arm: {int(s): v for s, v in finished(runs).items() if str(s).isdigit()} for arm, runs in records.items()}


def add_looks(table: pd.DataFrame, state: sequential.Replay, plan: StudyPlan) -> None:
    """A declared study's ``decided_at`` column (the look, and its seeds), in place; an undecided arm's verdict says
    whether it runs more seeds or stopped at the last look."""
    cells = []
    for i, arm in enumerate(table["arm"]):
        s = state.arms.get(arm)
        cells.append(f"look {s.look + 1} ({plan.looks[s.look]} seeds)" if s and s.look is not None else "")
        if s and s.look is None and len(plan.looks) > 1:
            table.loc[i, "why"] = (f"running: look {state.looks_done + 1} of {len(plan.looks)} next" if s.running
                                   else f"at {plan.looks[-1]} seeds, the last look")  # fmt: skip
    table.insert(table.columns.get_loc("verdict") + 1, "decided_at", cells)


def design_notes(state: sequential.Replay, plan: StudyPlan, judging: Judging) -> list[str]:
    """A declared study's lines under its table: its design and when it was declared, the no-op control's reading
    of the regime, the runs spent, and what a fixed design deciding each arm with 80% power would have run."""
    where = f"commit {plan.commit[:8] or '?'}, {plan.source or 'plan'}"
    done = ", every arm decided" if state.finished and state.looks_done < len(plan.looks) else ""
    lines = [f"declared {plan.declared or '(not stored)'} ({where}): {study_plan.describe(plan)}; "
             f"{state.looks_done} of {len(plan.looks)} looks done{done}"]  # fmt: skip
    if plan.control and not math.isnan(state.control_sd):
        if state.paired:
            lines.append(f"no-op control (+ablate=noop, the baseline's update up to float rounding): its paired "
                         f"difference has a per-seed sd of {state.control_sd:.3g}; pairing by seed holds")  # fmt: skip
        else:
            lines.append(f"the regime is chaotic at the seed level: the no-op control (the baseline's update up to "
                         f"float rounding) is not equivalent to the baseline at the first look, its per-seed sd "
                         f"{state.control_sd:.3g} is the floor below which no difference can be read from a seed, "
                         "and every arm is judged unpaired (Welch)")  # fmt: skip
    spent = sum(s.seeds for s in state.arms.values()) + max((s.seeds for s in state.arms.values()), default=0)
    level = judging.alpha / max(1, len(state.arms))
    tests = [s.verdict for s in state.arms.values() if s.verdict.comparison and s.verdict.comparison.testable]
    fixed = [power.seeds_for(v.delta, v.comparison.variances, margin=judging.margin, level=level) for v in tests]
    needed = max((n for n in fixed if n), default=None)
    arms = len(state.arms)
    fixed_words = (f"a fixed design deciding each arm with 80% power at its estimated Δ and σ (α/{arms}) would "
                   f"run {needed:,} seeds an arm: {needed * (arms + 1):,} runs") if needed else ""  # fmt: skip
    lines.append(f"runs spent: {spent} (each arm's seeds and the baseline's)" + (f"; {fixed_words}" if needed else ""))
    return lines


def noise_notes(table: pd.DataFrame, comparisons: dict[str, stats.Comparison]) -> list[str]:
    """A note when an arm's evaluation noise, sqrt(eval SE_arm² + eval SE_base²) for a one-seed Δ, is at least
    ``NOISE_SHARE`` of the spread of Δ between seeds (``Comparison.sigma``): more seeds then sharpen Δ less than a
    larger evaluation would."""
    if "eval_se" not in table.columns:
        return []
    base_se, noisy = table["eval_se"].iloc[0], []
    for _, row in table.iloc[1:].iterrows():
        if row["arm"] not in comparisons:  # a declared study's arm before its first look
            continue
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


def plan_seeds_table(arms: list[tuple[str, str]], base: str, records: dict[str, list[RunRecord]], judging: Judging,
                     plan: StudyPlan | None) -> pd.DataFrame:  # fmt: skip
    """``--plan-seeds``: per arm, from a pilot's runs, the seeds a fixed design needs to decide it with 80% power at
    the family's first level (α over the arms, from the 70% upper bound of the pilot's variance), the seeds it
    runs on average under the sequential design (the plan's looks, or 5 every 5 up to 20); the pilot's mean time a
    run in ``attrs`` (for the wall time)."""
    reference = finished(records[base])
    compared = [a for a in arms if a[0] != base]
    design = plan or study_plan.StudyPlan(study="pilot", arms={}, baseline="", design="until_decided")
    design = replace(design, margin=judging.margin, alpha=judging.alpha)
    level = judging.alpha / max(1, len(compared))
    seconds = mean_of([r.seconds for runs in records.values() for r in runs if r.status == "FINISHED"])
    rows = []
    for label, overrides in compared:
        values = finished(records[label])
        shared = values.keys() & reference.keys()  # an arm decided early ran fewer seeds: paired on those it has
        if len(shared) >= 2:
            values, base = {s: values[s] for s in shared}, {s: reference[s] for s in shared}
        else:
            base = reference
        test = compare(values, base, margin=judging.margin)
        fixed = expected = NAN
        if test.identical:  # decided at the first look whatever the design
            expected = float(design.looks[0])
        elif test.testable:
            needed = power.seeds_to_decide(test.delta, test.variances, test.n, test.df, margin=judging.margin,
                                           level=level)  # fmt: skip
            fixed = float(needed) if needed else NAN
            sigma = math.sqrt(sum(power.planned_variances(test.variances, test.df)))
            expected = sequential.expected_seeds(test.delta, sigma, design, len(compared))[0]
        rows.append({"arm": label, "n": test.n, "test": test.test, "delta": test.delta, "sigma": test.sigma,
                     "fixed_seeds": fixed, "sequential_seeds": expected, "overrides": overrides})  # fmt: skip
    columns = ["arm", "n", "test", "delta", "sigma", "fixed_seeds", "sequential_seeds", "overrides"]
    frame = pd.DataFrame(rows, columns=columns)
    frame.attrs["looks"], frame.attrs["seconds"] = design.looks, seconds
    return frame
