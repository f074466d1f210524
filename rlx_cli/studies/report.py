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
from rlx_cli.studies import compute_axis, report_format, scaling_report, stats
from rlx_cli.studies.runs import connect, histories, load_runs, only_seeds
from rlx_cli.studies.study import SEED_KEY, canonical_tokens, key_of, override_tokens, quoted

REDUCE = ("last", "max", "mean_last_k", "mean_first_k")
FITS = ("entropy", "sigmoid")  # rlx report --fit: entropy_fit.py, scaling_report.py
FORMATS = ("md", "csv", "tex", "html")


@dataclass
class Arm:
    tokens: list[str]  # the overrides without the seed, sorted
    algo: str
    ablate: str
    runs: list = field(default_factory=list)  # mlflow Run objects, one per seed
    label: str = ""

    @property
    def key(self) -> str:
        """Its overrides as one command line's words."""
        return " ".join(map(quoted, self.tokens))


def group_arms(runs: list) -> list[Arm]:
    """Arms by overrides minus the seed, in the order they started; labels name what differs between them."""
    arms: dict[str, Arm] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        tokens = [t for t in canonical_tokens(tags["rlx.overrides"]) if key_of(t) != SEED_KEY]
        arm = arms.setdefault("\0".join(tokens), Arm(tokens, tags.get("rlx.algo", "?"), tags.get("rlx.ablate", "none")))
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
        label = " ".join([arm.algo, *ablate, *map(quoted, differing)])
        seen[label] = seen.get(label, 0) + 1
        arm.label = label if seen[label] == 1 else f"{label} #{seen[label]}"
    return found


def common_overrides(arms: list[Arm]) -> str:
    common = common_tokens(arms)
    return " ".join(quoted(t) for t in arms[0].tokens if t in common)


def default_baseline(arms: list[Arm]) -> Arm:
    """The baseline when ``--baseline`` is not given: the first arm without ablation (else the first arm)."""
    return next((a for a in arms if a.ablate == "none"), arms[0])


def pick_arm(arms: list[Arm], name: str, option: str) -> Arm:
    """The one arm ``name`` names: its label, or overrides (and the algorithm) that single it out."""
    exact = [a for a in arms if a.label == name]
    wanted = set(override_tokens(name))
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
    x: str | None = None,
    fit_from: float = 0.0,
) -> str:
    """``rlx report``: returns the formatted table (and writes it to ``out``, the per-run data beside it, the curves
    to ``plots``).

    ``x``: the curves' axis, ``step`` or a compute axis (``compute_axis.py``): every run cut at the common budget,
    an AUC column and the realised samples. ``fit="entropy"``: instead, per arm the fit of R = −a·exp(H) + b to
    (train/entropy, ``metric``) (``entropy_fit.py``). ``power``: instead, the seeds each arm needs to detect a Δ of
    that size (planning).
    """
    from rlx_cli.studies import entropy_fit

    if reduce_by not in REDUCE:
        raise UserError(f"--reduce {reduce_by} is not valid (valid: {', '.join(REDUCE)})")
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt} is not valid (valid: {', '.join(FORMATS)})")
    if k < 1:
        raise UserError(f"--k {k} is not valid (valid: 1 or more)")
    if fit is not None and fit not in FITS:
        raise UserError(f"--fit {fit} is not valid (valid: {', '.join(FITS)})")
    scaling_report.check_fit_from(fit_from)
    if x is not None:
        compute_axis.check_axis(x)
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
    if fit == "entropy":
        return written(entropy_fit.fit_report(arms, metric, known, plots), out)
    base = named_base or default_baseline(arms)
    _, client = connect()
    spent = [m for m in ("perf/samples", compute_axis.AXES.get(x)) if m in known]  # absent from older runs
    curves = histories(client, [r for a in arms for r in a.runs], [metric, *extras, *spent])
    if fit == "sigmoid":
        on_axis(arms, curves, [metric], x or "step")
        points = {r.info.run_id: curves[r.info.run_id, metric] for a in arms for r in a.runs}
        text = written(
            scaling_report.sigmoid_report(arms, base, points, metric, x or "step", fit_from, plots, out), out
        )
        data_and_plots(arms, curves, [metric], reduce_by, k, out, plots, x or "step")
        return text
    what = {"mean_last_k": f"mean of the last {k}", "mean_first_k": f"mean of the first {k}"}.get(reduce_by, reduce_by)
    axis = Axis()
    if x is not None:
        axis = put_on_axis(arms, curves, metric, extras, x)
        what += "" if x == "step" else f" up to {x} = {compute_axis.amount(axis.budget)}"
    context = report_format.Context(
        metric=metric,
        reduce=what,
        baseline=base.label,
        common=common_overrides(arms),
        source=" · ".join(f"{k_} {v}" for k_, v in (("experiment", experiment), ("study", study)) if v),
        extras=[*extras, *axis.columns],
        minimize=minimize,
        described=axis.columns,
        axis=x or "step",
        budget=axis.caption,
    )
    if power is not None:
        planning = power_table(arms, base, curves, metric, reduce_by, k, power)
        text = report_format.render_power(planning, context, power, fmt)
    else:
        table = build_table(arms, base, curves, metric, context.extras, reduce_by, k, with_stats)
        text = report_format.render(table, context, fmt)
    written(text, out)
    data_and_plots(arms, curves, [metric, *extras], reduce_by, k, out, plots, context.axis)
    return text


def data_and_plots(arms, curves, metrics: list[str], how: str, k: int, out: Path | None, plots: Path | None, axis):
    """The per-run data beside ``out`` (``per_run_data``) and the curves of ``metrics`` in ``plots``, when given."""
    written_paths = per_run_data(arms, curves, metrics[0], metrics[1:], how, k, out) if out is not None else []
    if plots is not None:
        written_paths += report_format.plot_curves(arms, curves, metrics, plots, axis)
    for path in written_paths:
        print(f"wrote {path}", flush=True)


@dataclass
class Axis:
    """A compute axis put on the curves: the common budget, the caption's words for it, and the table's extra
    columns (name -> legend), whose one-point curves the report added."""

    budget: float = float("nan")
    caption: str = ""
    columns: dict[str, str] = field(default_factory=dict)


def put_on_axis(arms: list[Arm], curves: dict, metric: str, extras: list[str], x: str) -> Axis:
    """``curves`` of the arms' runs in place on axis ``x``, cut at the common budget (``compute_axis``); adds the
    one-point curves of the AUC and of the samples each run drew in all -> the Axis."""
    runs = [r.info.run_id for a in arms for r in a.runs]
    samples = {run: curves.get((run, "perf/samples"), []) for run in runs}
    spent = on_axis(arms, curves, [metric, *extras], x)
    budget = compute_axis.common_budget([curves[run, metric] for run in runs])
    starts = {run: curves[run, metric][0][0] for run in runs if curves[run, metric]}
    late = [a.label for a in arms if any(starts.get(r.info.run_id, budget) > budget for r in a.runs)]
    auc = f"AUC of {metric}"
    columns = {auc: f"the area under the run's {metric} curve over {x} (to the budget) divided by its {x} range: "
                    "the curve's mean height, mean ± sample std over seeds"}  # fmt: skip
    for run in runs:
        for name in [metric, *extras]:
            curves[run, name] = compute_axis.cut(curves[run, name], budget)
        curves[run, auc] = [(0, compute_axis.area(curves[run, metric]))]
    if all(samples.values()):
        columns["samples drawn"] = "answers each run sampled in all (perf/samples at its end), mean ± std over seeds"
        for run in runs:
            curves[run, "samples drawn"] = samples[run][-1:]
    caption = (
        f"at equal {compute_axis.UNITS[x]}: every run's curve cut at {x} = {compute_axis.amount(budget)}, the "
        "smallest budget any run reached, its value there interpolated"
        if spent
        else "AUC over steps"
    )
    if late:  # e.g. value pretraining's answers, drawn before the first evaluation
        caption += (
            f"; runs of {', '.join(late)} have no point before the budget (their first evaluation comes after "
            f"{x} = {compute_axis.amount(budget)}: what they sampled before RL counts), so no value: compare "
            "them with --x step"
        )
    return Axis(budget, caption, columns)


def on_axis(arms: list[Arm], curves: dict, names: list[str], x: str) -> str | None:
    """The curves of ``names`` of the arms' runs, in place, from [(step, value)] to [(x, value)] -> the metric that
    gives x (None for steps); a UserError when a run did not log it."""
    spent, runs = compute_axis.AXES[x], [r.info.run_id for a in arms for r in a.runs]
    if spent is not None and any(not curves.get((run, spent)) for run in runs):
        raise UserError(
            f"--x {x}: some runs did not log {spent} (runs from before rlx logged compute; valid: --x step)"
        )
    for run in runs:
        for name in names:
            points = curves[run, name]
            curves[run, name] = compute_axis.on_axis(points, curves[run, spent]) if spent else points
    return spent


def per_run_data(arms: list[Arm], curves: dict, metric: str, extras: list[str], how: str, k: int, out: Path):
    """``<out stem>-runs.csv`` (arm, seed, run id, the metric's per-run value as in the table) and
    ``<out stem>-curves.csv`` (arm, seed, run id, metric, x, value: every point the table and plots used) beside
    ``out``, so that a report's statistics can be recomputed without the MLflow store -> their paths."""
    runs, points = [], []
    for arm in arms:
        for run in arm.runs:
            seed, run_id = run.data.tags.get("rlx.seed", ""), run.info.run_id
            runs.append({"arm": arm.label, "seed": seed, "run_id": run_id,
                         metric: reduce(curves[run_id, metric], how, k)})  # fmt: skip
            points += [
                {"arm": arm.label, "seed": seed, "run_id": run_id, "metric": name, "x": at, "value": value}
                for name in [metric, *extras]
                for at, value in curves[run_id, name]
            ]
    paths = out.with_name(f"{out.stem}-runs.csv"), out.with_name(f"{out.stem}-curves.csv")
    for path, rows in zip(paths, (runs, points)):
        pd.DataFrame(rows).to_csv(path, index=False)
    return list(paths)


def written(text: str, out: Path | None) -> str:
    """``text``, also written to ``out`` when given."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text
