"""Decoupled against naive PPO at each lag, paired by seed, Holm over the lags: the staleness study's pair table.

    python reports/staleness/pairs.py reports/staleness/regime-runs.csv > reports/staleness/regime-pairs.md

Reads a ``*-runs.csv`` that ``rlx report --out`` wrote for the study's ten arms (``grpo rollout.lag=K
trainer.old_logp=sampler``: naive; ``grpo rollout.lag=K rollout_correction=tis trainer.old_logp=trainer``:
decoupled) and prints, per lag, both arms' mean ± std of the table's metric, Δ = decoupled − naive, the paired
t-test's p, Holm's p over the lags, the 95% interval of Δ and the verdict (better, worse, equivalent within ±0.02,
inconclusive with the seeds that would decide it), as ``rlx report --stats`` labels a table's arms.
"""

from __future__ import annotations

import re
import sys

import pandas as pd

from rlx_cli.studies import stats
from rlx_cli.studies.report_table import Judging, judge

MARGIN = 0.02


def per_lag(runs: pd.DataFrame, metric: str) -> dict[int, dict[str, dict[str, float]]]:
    """{lag: {"naive" | "decoupled": {seed: value}}} of the finished runs."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for _, row in runs[runs["status"] == "FINISHED"].iterrows():
        lag = int(re.search(r"rollout\.lag=(\d+)", row["arm"]).group(1))
        kind = "naive" if "old_logp=sampler" in row["arm"] else "decoupled"
        out.setdefault(lag, {}).setdefault(kind, {})[str(row["seed"])] = float(row[metric])
    return out


def pair_table(path: str) -> str:
    runs = pd.read_csv(path)
    metric = runs.columns[3]  # arm, seed, run_id, then the table's metric
    lags = per_lag(runs, metric)
    tests = {lag: stats.compare(arms["decoupled"], arms["naive"], level=0.95) for lag, arms in sorted(lags.items())}
    table = pd.DataFrame(
        {"arm": list(tests), "delta": [t.delta for t in tests.values()], "p_value": [t.p for t in tests.values()],
         "p_equivalent": [stats.equivalence_p(t, MARGIN) for t in tests.values()]}
    )  # fmt: skip
    judge(table, tests, Judging(margin=MARGIN))  # Holm over the lags, then rlx report's verdict and seeds
    lines = [
        f"{metric}, decoupled (trainer.old_logp=trainer + TIS) against naive (trainer.old_logp=sampler) at each lag, "
        f"paired by seed, Holm over {len(tests)} lags, δ = {MARGIN} ({path})",
        "",
        "| lag | naive | decoupled | Δ | p | p (Holm) | 95% CI of Δ | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for row in table.itertuples():
        test, said = tests[row.arm], row.verdict
        if said == "inconclusive":
            said += f" ({row.seeds_needed} seeds)"
        naive, decoupled = (list(lags[row.arm][k].values()) for k in ("naive", "decoupled"))
        lines.append(
            f"| {row.arm} | {stats.mean(naive):.3f} ± {stats.std(naive):.3f} | {stats.mean(decoupled):.3f} ± "
            f"{stats.std(decoupled):.3f} | {test.delta:+.3f} | {test.p:.3f} | {row.p_holm:.3f} | "
            f"[{test.low:+.3f}, {test.high:+.3f}] | {said} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(pair_table(sys.argv[1]), end="")
