"""rlx report's health flags (collapsed, entropy-collapse, drift, diverged) and the evaluation's noise beside the
verdicts, on a study logged straight into a fresh MLflow store."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import table_rows

from rlx_cli.studies.report import report_command


def log_history(client, exp_id, overrides: str, seed: int, curves: dict, *, status: str = "FINISHED", start: int = 0):
    """A run of ``overrides`` and ``seed`` whose metrics are ``curves`` (name -> [(step, value)])."""
    from mlflow.entities import Metric

    tags = {"rlx.overrides": f"{overrides} seed={seed}", "rlx.algo": "grpo", "rlx.ablate": "none",
            "rlx.seed": str(seed), "rlx.study": "h"}  # fmt: skip
    run_id = client.create_run(exp_id, tags=tags, start_time=start).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, v, s, s) for k, points in curves.items() for s, v in points])
    client.set_terminated(run_id, status)


def healthy(final: float, **changes) -> dict:
    """Curves of a sound run: accuracy 0.9 -> ``final`` (SE 0.02), entropy 1.0 -> 0.8, small KLs, no skips."""
    curves = {
        "eval/accuracy": [(0, 0.9), (20, final)],
        "eval/accuracy_se": [(0, 0.02), (20, 0.02)],
        "train/entropy": [(s, 1.0 if s < 10 else 0.8) for s in range(1, 21)],
        "train/kl": [(s, 0.01) for s in range(1, 21)],
        "train/skipped_steps": [(s, 0.0) for s in range(1, 21)],
    }
    return curves | changes


@pytest.fixture(scope="module")
def health_uri(tmp_path_factory):
    """Study 'h': a sound baseline; a collapsed arm; one whose entropy collapses and KL drifts on one of two seeds;
    one whose NaN guard skipped updates on a seed; one whose only run FAILED."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('health') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("health")
    arms = {
        "algo=grpo": [healthy(0.92), healthy(0.94)],
        "algo=grpo trainer.lr=0.1": [healthy(0.3), healthy(0.2)],  # 0.9 -> 0.3: far past 2 SE = 0.057
        "algo=grpo kl.coef=0": [
            healthy(0.93, **{"train/entropy": [(s, 1.0 if s < 10 else 0.05) for s in range(1, 21)]}),
            healthy(0.93, **{"train/kl": [(s, 0.8) for s in range(1, 21)]}),
        ],
        "algo=grpo trainer.epochs=2": [healthy(0.91), healthy(0.95, **{"train/skipped_steps": [(19, 0.0), (20, 2.0)]})],
    }
    start = 0
    for overrides, runs in arms.items():
        for seed, curves in enumerate(runs):
            start += 1
            log_history(client, exp_id, overrides, seed, curves, start=start)
    log_history(client, exp_id, "algo=grpo trainer.lr=1.0", 0, {"eval/accuracy": [(0, 0.9)]}, status="FAILED", start=99)
    return uri


def test_health_flags_and_eval_se_beside_the_verdicts(health_uri, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", health_uri)
    text = report_command(study="h", with_stats=True, margin=0.05)
    headers = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    rows = {r[0]: r for r in table_rows(text)}
    health, se = headers.index("health"), headers.index("eval SE")
    assert {arm: row[health] for arm, row in rows.items()} == {
        "grpo": "ok",
        "grpo trainer.lr=0.1": "collapsed",
        "grpo kl.coef=0": "entropy-collapse, drift",  # each on one of its two seeds: half of them
        "grpo trainer.epochs=2": "diverged",
        "grpo trainer.lr=1.0": "diverged",
    }
    assert rows["grpo"][se] == "0.020" and rows["grpo trainer.lr=1.0"][1:4] == ["–", "0", "–"]  # no FINISHED run
    # Δ -0.68 from per-seed differences -0.62, -0.74: t = 11.3 with 1 df, p = 0.056; planned at the level the step-down
    # stopped at, from the 70% upper bound of a 1-df variance (6.7 times the seeds'), 5 seeds find it
    assert rows["grpo trainer.lr=0.1"][headers.index("verdict")] == "inconclusive (5 seeds)"
    assert (
        "health of grpo trainer.lr=0.1: collapsed (seed 0: eval/accuracy 0.900 → 0.300 (2 SE = 0.057), "
        "seed 1: eval/accuracy 0.900 → 0.200 (2 SE = 0.057))"
    ) in text
    assert "health of grpo kl.coef=0: entropy-collapse (seed 0: train/entropy 1 → 0.05 (< 10% of its start)); " in text
    assert "drift (seed 1: train/kl 0.8 (> 0.5))" in text and "diverged (seed 0: FAILED)" in text
    assert "diverged (seed 1: the NaN guard skipped 2 updates)" in text
    # the evaluation's noise of a one-seed Δ, hypot(0.02, 0.02) = 0.0283, against the spread of the per-seed Δ:
    # kl.coef=0's (0.01, -0.01) spread 0.0141, lr=0.1's (-0.62, -0.74) 0.085
    assert "evaluation noise: " in text and "grpo kl.coef=0: 0.0283 against 0.0141" in text
    assert "grpo trainer.lr=0.1:" not in text.split("evaluation noise: ")[1]  # its Δ spreads 0.085 between seeds

    out = tmp_path / "t.md"
    report_command(study="h", with_stats=True, margin=0.05, out=out)
    runs = pd.read_csv(tmp_path / "t-runs.csv")
    assert runs["status"].tolist().count("FAILED") == 1 and "eval/accuracy_se" in runs.columns
    assert runs.set_index(["arm", "seed"]).loc[("grpo trainer.lr=0.1", 1), "eval/accuracy end"] == 0.2
    again = report_command(runs=tmp_path / "t-runs.csv", with_stats=True, margin=0.05)
    assert table_rows(again) == table_rows(text) and "health of grpo trainer.lr=0.1: collapsed" in again
    assert "runs " + str(tmp_path / "t-runs.csv") in again


def test_an_arm_whose_runs_logged_no_evaluation_se_is_not_judged_ok():
    """collapsed needs the evaluation's SE: an arm with a FINISHED run that logged none says "not judged", not "ok"
    (an arm whose runs did log it, and raise nothing, is ok)."""
    from rlx_cli.studies import health
    from rlx_cli.studies.report_table import build_table
    from rlx_cli.studies.run_records import RunRecord

    def record(arm: str, seed: str, se: float) -> RunRecord:
        found = RunRecord(arm, seed, f"{arm}-{seed}", "FINISHED", 0.6)
        found.figures = dict.fromkeys(health.FIGURES, float("nan")) | {
            "eval/accuracy start": 0.5, "eval/accuracy end": 0.6, "eval/accuracy_se start": se,
            "eval/accuracy_se end": se, "train/entropy start": 1.0, "train/entropy end": 0.9,
        }  # fmt: skip
        return found

    records = {
        "base": [record("base", s, 0.02) for s in "01"],
        "blind": [record("blind", s, float("nan")) for s in "01"],
    }
    table, _ = build_table([("base", ""), ("blind", "")], "base", records, [], None)
    assert table.set_index("arm")["health"].to_dict() == {"base": "ok", "blind": "not judged"}
