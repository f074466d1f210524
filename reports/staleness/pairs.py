"""Decoupled against naive PPO at each lag, paired by seed, Holm over the lags: the staleness study's pair table.

    python reports/staleness/pairs.py reports/staleness/regime-runs.csv > reports/staleness/regime-pairs.md

Reads a ``*-runs.csv`` that ``rlx report --out`` wrote for the study's ten arms (``grpo rollout.lag=K
trainer.old_logp=sampler``, or the plan's ``naive-lagK``: naive; ``grpo rollout.lag=K rollout_correction=tis
trainer.old_logp=trainer``, or ``decoupled-lagK``: decoupled) and prints, per lag, both arms' mean ± std of the table's
metric, Δ = decoupled − naive, the paired t-test's p, the p-values adjusted over the lags, the interval of Δ that
decided the verdict and its level, and the verdict (better, worse, equivalent within ±0.02, inconclusive with the seeds
that would decide it), as ``rlx report --stats`` judges a table's arms (``stats.judge``).
"""

from __future__ import annotations

import re
import sys

import pandas as pd

from rlx_cli.studies import stats
from rlx_cli.studies.comparison import compare, mean, std
from rlx_cli.studies.report_format import p_value, percent, verdict_cell

MARGIN = 0.02


def lag_and_kind(arm: str) -> tuple[int, str]:
    """An arm's lag and kind, from its overrides (the committed tables) or its plan's name (``naive-lag4``)."""
    found = re.search(r"rollout\.lag=(\d+)", arm) or re.fullmatch(r"(?:naive|decoupled)-lag(\d+)", arm)
    return int(found.group(1)), "naive" if "old_logp=sampler" in arm or arm.startswith("naive-") else "decoupled"


def per_lag(runs: pd.DataFrame, metric: str) -> dict[int, dict[str, dict[str, float]]]:
    """{lag: {"naive" | "decoupled": {seed: value}}} of the finished runs."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for _, row in runs[runs["status"] == "FINISHED"].iterrows():
        lag, kind = lag_and_kind(row["arm"])
        out.setdefault(lag, {}).setdefault(kind, {})[str(row["seed"])] = float(row[metric])
    return out


def pair_table(path: str) -> str:
    runs = pd.read_csv(path)
    metric = runs.columns[3]  # arm, seed, run_id, then the table's metric
    lags = per_lag(runs, metric)
    tests = {lag: compare(arms["decoupled"], arms["naive"], margin=MARGIN) for lag, arms in sorted(lags.items())}
    judging = stats.Judging(margin=MARGIN)
    verdicts = stats.judge({lag: (t, 0) for lag, t in tests.items()}, judging)  # one family over the lags
    lines = [
        f"{metric}, decoupled (trainer.old_logp=trainer + TIS) against naive (trainer.old_logp=sampler) at each lag, "
        f"paired by seed, one family over {len(tests)} lags (rlx report --stats's verdicts), δ = {MARGIN} ({path})",
        "",
        "| lag | naive | decoupled | Δ | p | p (Holm) | TOST p (Holm) | interval of Δ | level | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for lag, v in verdicts.items():
        naive, decoupled = (list(lags[lag][k].values()) for k in ("naive", "decoupled"))
        cell = verdict_cell({"verdict": v.label, "within_margin": v.within, "seeds_needed": v.seeds_needed,
                             "why": v.why})  # fmt: skip
        ps = " | ".join(p_value(p, judging.alpha) for p in (v.p, v.p_adjusted, v.p_equivalent_adjusted))
        lines.append(
            f"| {lag} | {mean(naive):.3f} ± {std(naive):.3f} | {mean(decoupled):.3f} ± {std(decoupled):.3f} | "
            f"{v.delta:+.3f} | {ps} | [{v.low:+.3f}, {v.high:+.3f}] | {percent(v.level)} | {cell} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(pair_table(sys.argv[1]), end="")
