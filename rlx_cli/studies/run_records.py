"""One record per run of a report: what its table, statistics, verdicts and health flags read of the run.

``rlx report --out T.md`` writes them to ``T-runs.csv`` beside the table (and every curve point to ``T-curves.csv``);
``rlx report --runs T-runs.csv`` reads them back and rebuilds the table without the MLflow store. Columns: ``arm``,
``seed``, ``run_id``, the table's metric (its per-run value, reduced as the table's caption says), ``status``
(FINISHED, or FAILED: a run the health flags count), ``<metric>_se`` (the evaluation's own standard error, reduced the
same way, where the metric has one) and the figures the health flags read (``health.FIGURES``). Files written before
these columns existed hold the first four; a table rebuilt from them has no eval SE and no health column.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rlx_cli.config.errors import UserError
from rlx_cli.studies import acted, health

NAN = float("nan")
KEYS = ("arm", "seed", "run_id")


@dataclass
class RunRecord:
    arm: str  # its arm's label
    seed: str  # rlx.seed (the run id when a run has none)
    run_id: str
    status: str  # FINISHED | FAILED
    value: float  # the table's metric, reduced; NaN when the run did not log it
    se: float = NAN  # the metric's own standard error (eval/accuracy -> eval/accuracy_se), reduced the same way
    figures: dict[str, float] = field(default_factory=lambda: dict.fromkeys(health.FIGURES, NAN))
    extras: dict[str, float] = field(default_factory=dict)  # more columns (--extra-metrics), reduced
    acted: dict[str, float] = field(default_factory=lambda: dict.fromkeys(acted.FIGURES, NAN))  # did it act (acted.py)
    seconds: float = NAN  # the run's wall time, from the store


def reduce(points: list[tuple[float, float]], how: str, k: int) -> float | None:
    """A run's curve [(x, value)] as one number: last | max | mean_last_k | mean_first_k; None for no points."""
    values = [v for _, v in points]
    if not values:
        return None
    if how == "last":
        return values[-1]
    if how == "max":
        return max(values)
    part = values[:k] if how == "mean_first_k" else values[-k:]  # the start: train/* from step 1, eval/* from 0
    return sum(part) / len(part)


def reduced(points: list[tuple[float, float]], how: str, k: int) -> float:
    """``reduce``, NaN for no points."""
    value = reduce(points, how, k)
    return NAN if value is None else value


def se_metric(metric: str) -> str:
    """The metric that holds ``metric``'s standard error: eval/accuracy -> eval/accuracy_se."""
    return f"{metric}_se"


def finished(records: list[RunRecord]) -> dict[str, float]:
    """seed -> value of the FINISHED runs that logged the metric: what the statistics compare."""
    return {r.seed: r.value for r in records if r.status == "FINISHED" and not math.isnan(r.value)}


def write(records: list[RunRecord], metric: str, path: Path) -> Path:
    """``records`` as ``path`` (the module's columns; an SE column only where the metric has one)."""
    with_se = any(not math.isnan(r.se) for r in records)
    rows = []
    for r in records:
        row = {"arm": r.arm, "seed": r.seed, "run_id": r.run_id, metric: r.value, "status": r.status}
        rows.append(row | ({se_metric(metric): r.se} if with_se else {}) | r.figures)
    with_acted = any(not math.isnan(v) for r in records for v in r.acted.values())  # runs that logged the figures
    rows = [row | (r.acted if with_acted else {}) for row, r in zip(rows, records)]
    columns = [*KEYS, metric, "status", *([se_metric(metric)] if with_se else []), *health.FIGURES,
               *(acted.FIGURES if with_acted else ())]  # fmt: skip
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    return path


def read(path: Path, extras: list[str], how: str, k: int) -> tuple[str, list[RunRecord]]:
    """``path`` (a ``*-runs.csv``) -> (its metric, its records); ``extras`` reduced from the ``*-curves.csv`` beside
    it. Numbers are read as written (Python's float of the text), so the table's means come out as they did."""
    if not path.is_file():
        raise UserError(f"--runs {path}: no such file (valid: a *-runs.csv that rlx report --out wrote)")
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = list(rows[0]) if rows else []
    if columns[:3] != list(KEYS) or len(columns) < 4:
        raise UserError(f"--runs {path}: not a table's per-run data (valid: a *-runs.csv with the columns "
                        "arm, seed, run_id and the metric, as rlx report --out writes it)")  # fmt: skip
    metric = columns[3]
    curves = curve_points(path, extras) if extras else {}
    records = []
    for row in rows:
        record = RunRecord(row["arm"], row["seed"], row["run_id"], row.get("status") or "FINISHED", number(row[metric]))
        record.se = number(row.get(se_metric(metric), ""))
        record.figures = {name: number(row.get(name, "")) for name in health.FIGURES}
        record.acted = {name: number(row.get(name, "") or "") for name in acted.FIGURES}
        record.extras = {m: reduced(curves.get((record.run_id, m), []), how, k) for m in extras}
        records.append(record)
    return metric, records


def number(text: str) -> float:
    return float(text) if text.strip() else NAN


def curve_points(runs_path: Path, metrics: list[str]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(run id, metric) -> [(x, value)] of ``metrics`` from the ``*-curves.csv`` beside ``runs_path``."""
    path = runs_path.with_name(runs_path.name.removesuffix("-runs.csv") + "-curves.csv")
    if not path.is_file():
        raise UserError(f"--extra-metrics {','.join(metrics)} needs {path} beside --runs (valid: the *-curves.csv that "
                        "rlx report --out wrote with it)")  # fmt: skip
    points = pd.read_csv(path, dtype={"run_id": str, "metric": str}, float_precision="round_trip")
    found = set(points["metric"])
    missing = [m for m in metrics if m not in found]
    if missing:
        raise UserError(f"no metric '{missing[0]}' in {path} (valid: {', '.join(sorted(found))})")
    chosen = points[points["metric"].isin(metrics)].sort_values("x", kind="stable")
    return {(run, m): list(zip(g["x"], g["value"])) for (run, m), g in chosen.groupby(["run_id", "metric"])}
