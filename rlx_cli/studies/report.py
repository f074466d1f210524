"""``rlx report``: tracked runs -> an ablation table (one row per arm, mean ± std over seeds) and learning curves.

1. read the FINISHED runs of an experiment or a study from MLflow (any tracking URI), without study parents
2. group them into arms by their overrides minus ``seed=`` (the latest run per seed counts)
3. reduce each run's metric history to one number (last | max | mean_last_k | mean_first_k), then mean ± std per arm
4. Δ vs the baseline arm (default: the first arm without an ablation); with ``--stats`` per arm the paired or
   Welch t-test, its CI, p, Holm's p across the table and the detectable effect (``stats.compare``);
   with ``--power Δ`` instead the seeds each arm needs to detect Δ
5. format (md | csv | tex | html, see ``report_format``) and optionally plot the curves
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rlx_cli.config.errors import UserError
from rlx_cli.studies import stats
from rlx_cli.studies.runs import connect, histories, load_runs, only_seeds
from rlx_cli.studies.study import SEED_KEY, canonical, key_of

REDUCE = ("last", "max", "mean_last_k", "mean_first_k")
FORMATS = ("md", "csv", "tex", "html")


@dataclass
class Arm:
    key: str  # the canonical overrides without the seed
    algo: str
    ablate: str
    runs: list = field(default_factory=list)  # mlflow Run objects, one per seed
    label: str = ""

    @property
    def tokens(self) -> list[str]:
        return self.key.split()


def group_arms(runs: list) -> list[Arm]:
    """Arms by overrides minus the seed, in the order they started; labels name what differs between them."""
    arms: dict[str, Arm] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        key = " ".join(t for t in canonical(tags["rlx.overrides"]).split() if key_of(t) != SEED_KEY)
        arm = arms.setdefault(key, Arm(key, tags.get("rlx.algo", "?"), tags.get("rlx.ablate", "none")))
        seed = tags.get("rlx.seed", "?")
        arm.runs = [r for r in arm.runs if r.data.tags.get("rlx.seed", "?") != seed] + [run]  # a re-run replaces
    return labelled(list(arms.values()))


def common_tokens(arms: list[Arm]) -> set[str]:
    """The override tokens every arm has."""
    return set.intersection(*(set(a.tokens) for a in arms))


def labelled(found: list[Arm]) -> list[Arm]:
    """``found`` with each arm's label: its algorithm, ablation and the overrides that differ between these arms."""
    common = common_tokens(found)
    seen: dict[str, int] = {}
    for arm in found:
        differing = [t for t in arm.tokens if t not in common and key_of(t) not in ("algo", "ablate")]
        ablate = [] if arm.ablate == "none" else [f"+ablate={arm.ablate}"]
        label = " ".join([arm.algo, *ablate, *differing])
        seen[label] = seen.get(label, 0) + 1
        arm.label = label if seen[label] == 1 else f"{label} #{seen[label]}"
    return found


def common_overrides(arms: list[Arm]) -> str:
    common = common_tokens(arms)
    return " ".join(t for t in arms[0].tokens if t in common)


def default_baseline(arms: list[Arm]) -> Arm:
    """The baseline when ``--baseline`` is not given: the first arm without ablation (else the first arm)."""
    return next((a for a in arms if a.ablate == "none"), arms[0])


def pick_arm(arms: list[Arm], name: str, option: str) -> Arm:
    """The one arm ``name`` names: its label, or overrides (and the algorithm) that single it out."""
    exact = [a for a in arms if a.label == name]
    wanted = set(name.split())
    matches = exact or [a for a in arms if wanted <= set(a.tokens) | {a.algo, a.label}]
    if len(matches) != 1:
        labels = "; ".join(a.label for a in arms)
        raise UserError(f"{option} '{name}' matches {len(matches)} arms (valid: {labels})")
    return matches[0]


def only_arms(arms: list[Arm], names: list[str] | None, base: Arm | None) -> list[Arm]:
    """``--arm`` (repeatable): just the arms named and ``base``, in the order they started, labelled against each
    other. Names are matched against the labels of the whole study, as ``--baseline`` is."""
    if not names:
        return arms
    chosen = {id(pick_arm(arms, name, "--arm")) for name in names} | ({id(base)} if base else set())
    return labelled([a for a in arms if id(a) in chosen])


def reduce(points: list[tuple[int, float]], how: str, k: int) -> float | None:
    values = [v for _, v in points]
    if not values:
        return None
    if how == "last":
        return values[-1]
    if how == "max":
        return max(values)
    if how == "mean_first_k":  # the start of training: train/* metrics from step 1, eval/* from step 0
        return stats.mean(values[:k])
    return stats.mean(values[-k:])


def by_seed(arm: Arm, curves, metric: str, how: str, k: int) -> dict[str, float]:
    """seed -> the run's reduced metric (runs without the metric left out)."""
    values = {
        r.data.tags.get("rlx.seed", r.info.run_id): reduce(curves[r.info.run_id, metric], how, k) for r in arm.runs
    }
    return {seed: v for seed, v in values.items() if v is not None}


def build_table(arms, base: Arm, curves, metric: str, extras: list[str], how: str, k: int, with_stats: bool):
    """Raw numbers, one row per arm (baseline first): what every format prints."""
    per_arm = {(arm.label, m): by_seed(arm, curves, m, how, k) for arm in arms for m in [metric, *extras]}
    reference = per_arm[base.label, metric]
    rows = []
    for arm in [base] + [a for a in arms if a is not base]:
        values = per_arm[arm.label, metric]
        listed = list(values.values())
        row = {"arm": arm.label, "n": len(values), "mean": stats.mean(listed), "std": stats.std(listed)}
        row["delta"] = row["mean"] - stats.mean(list(reference.values())) if values and reference else stats.NAN
        if with_stats:
            test = stats.compare(values, reference) if arm is not base else None
            row["test"] = test.test if test else ""
            row["p_value"] = test.p if test else stats.NAN
            row["ci_low"], row["ci_high"] = (test.low, test.high) if test else (stats.NAN, stats.NAN)
            row["detectable"] = test.detectable if test else stats.NAN
        for m in extras:
            listed = list(per_arm[arm.label, m].values())
            row[f"{m} mean"], row[f"{m} std"] = stats.mean(listed), stats.std(listed)
        row["overrides"] = arm.key
        rows.append(row)
    table = pd.DataFrame(rows)
    if with_stats:
        table.insert(table.columns.get_loc("p_value") + 1, "p_holm", stats.holm(table["p_value"].tolist()))
    return table


def power_table(arms, base: Arm, curves, metric: str, how: str, k: int, delta: float):
    """Per arm against the baseline: the pilot's n, test and spread, its detectable effect, the seeds Δ needs."""
    reference = by_seed(base, curves, metric, how, k)
    rows = []
    for arm in [a for a in arms if a is not base]:
        values = by_seed(arm, curves, metric, how, k)
        test = stats.compare(values, reference)
        needed = stats.seeds_needed(delta, test.variances) if test.test else None
        rows.append({
            "arm": arm.label, "n": len(values), "test": test.test, "sigma": test.sigma,
            "detectable": test.detectable, "seeds_needed": needed, "overrides": arm.key,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "n", "test", "sigma", "detectable", "seeds_needed", "overrides"])


def report_command(
    *,
    experiment: str | None = None,
    study: str | None = None,
    metric: str = "eval/accuracy",
    baseline: str | None = None,
    reduce_by: str = "last",
    k: int = 3,
    fmt: str = "md",
    out: Path | None = None,
    plots: Path | None = None,
    extra_metrics: str | None = None,
    with_stats: bool = False,
    minimize: bool = False,
    seeds: str | None = None,
    arm_names: list[str] | None = None,
    fit: str | None = None,
    power: float | None = None,
) -> str:
    """``rlx report``: returns the formatted table (and writes it to ``out``, the curves to ``plots``).

    ``fit="entropy"``: instead, per arm the fit of R = −a·exp(H) + b to (train/entropy, ``metric``)
    (``entropy_fit.py``). ``power``: instead, the seeds each arm needs to detect a Δ of that size (planning).
    """
    from rlx_cli.studies import entropy_fit, report_format

    if reduce_by not in REDUCE:
        raise UserError(f"--reduce {reduce_by} is not valid (valid: {', '.join(REDUCE)})")
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt} is not valid (valid: {', '.join(FORMATS)})")
    if k < 1:
        raise UserError(f"--k {k} is not valid (valid: 1 or more)")
    if fit is not None and fit not in entropy_fit.FITS:
        raise UserError(f"--fit {fit} is not valid (valid: {', '.join(entropy_fit.FITS)})")
    if power is not None and not power > 0:
        raise UserError(f"--power {power} is not valid (valid: the Δ to detect, > 0, in the metric's units, e.g. 0.02)")
    extras = [m.strip() for m in (extra_metrics or "").split(",") if m.strip()]
    runs = only_seeds(load_runs(experiment, study), seeds)
    known = sorted({m for r in runs for m in r.data.metrics})
    for name in [metric, *extras]:
        if name not in known:
            raise UserError(f"no metric '{name}' in these runs (valid: {', '.join(known)})")
    found = group_arms(runs)
    named_base = None if baseline is None else pick_arm(found, baseline, "--baseline")
    arms = only_arms(found, arm_names, named_base)
    if fit is not None:
        return written(entropy_fit.fit_report(arms, metric, known, plots), out)
    base = named_base or default_baseline(arms)
    _, client = connect()
    curves = histories(client, [r for a in arms for r in a.runs], [metric, *extras])
    what = {"mean_last_k": f"mean of the last {k}", "mean_first_k": f"mean of the first {k}"}.get(reduce_by, reduce_by)
    context = report_format.Context(
        metric=metric,
        reduce=what,
        baseline=base.label,
        common=common_overrides(arms),
        source=" · ".join(f"{k_} {v}" for k_, v in (("experiment", experiment), ("study", study)) if v),
        extras=extras,
        minimize=minimize,
    )
    if power is not None:
        planning = power_table(arms, base, curves, metric, reduce_by, k, power)
        text = report_format.render_power(planning, context, power, fmt)
    else:
        table = build_table(arms, base, curves, metric, extras, reduce_by, k, with_stats)
        text = report_format.render(table, context, fmt)
    written(text, out)
    if plots is not None:
        for path in report_format.plot_curves(arms, curves, [metric, *extras], plots):
            print(f"wrote {path}", flush=True)
    return text


def written(text: str, out: Path | None) -> str:
    """``text``, also written to ``out`` when given."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text
