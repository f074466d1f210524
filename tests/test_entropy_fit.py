"""rlx report --fit entropy: R = −a·exp(H) + b by least squares, by hand and against numpy; the report on a store."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_cli.config.errors import UserError
from rlx_cli.studies.entropy_fit import fit_entropy_law, paired
from rlx_cli.studies.report import report_command

H = [math.log(x) for x in (1.0, 2.0, 3.0, 4.0)]  # exp(H) = 1, 2, 3, 4


def test_exact_law_is_recovered():
    fit = fit_entropy_law(H, [2.5, 2.0, 1.5, 1.0])  # R = -0.5·exp(H) + 3
    assert (fit.a, fit.b, fit.r2, fit.n) == pytest.approx((0.5, 3.0, 1.0, 4))
    assert fit.predict(math.log(6.0)) == pytest.approx(0.0)


def test_noisy_fit_by_hand():
    # x̄ 2.5, R̄ 1.75, Sxx 5, SxR = -1.5·0.75 - 0.5·0.45 + 0.5·(-0.45) + 1.5·(-0.75) = -2.7 -> a 0.54, b 1.75 + 1.35
    # residuals -0.06, 0.18, -0.18, 0.06: SS_res 0.072; SS_tot 1.53 -> R² = 1 - 0.072/1.53
    fit = fit_entropy_law(H, [2.5, 2.2, 1.3, 1.0])
    assert fit.a == pytest.approx(0.54) and fit.b == pytest.approx(3.1)
    assert fit.r2 == pytest.approx(1 - 0.072 / 1.53)


def test_matches_numpy_least_squares():
    rng = np.random.default_rng(0)
    entropy = rng.uniform(0.1, 1.5, size=40)
    reward = -0.3 * np.exp(entropy) + 1.2 + rng.normal(0, 0.05, size=40)
    slope, intercept = np.polyfit(np.exp(entropy), reward, 1)
    predicted = slope * np.exp(entropy) + intercept
    r2 = 1 - ((reward - predicted) ** 2).sum() / ((reward - reward.mean()) ** 2).sum()
    fit = fit_entropy_law(entropy.tolist(), reward.tolist())
    assert (fit.a, fit.b, fit.r2) == pytest.approx((-slope, intercept, r2), rel=1e-9)


def test_degenerate_inputs():
    with pytest.raises(ValueError, match="two or more pairs"):
        fit_entropy_law([0.5], [1.0])
    with pytest.raises(ValueError, match="two or more pairs"):
        fit_entropy_law([0.5, 0.5], [1.0, 2.0])  # one entropy: no slope
    with pytest.raises(ValueError, match="differ in length"):
        fit_entropy_law([0.5, 0.6], [1.0])
    assert math.isnan(fit_entropy_law(H, [1.0] * 4).r2)  # a flat R: a = 0, R² undefined


def test_paired_keeps_the_steps_both_histories_have():
    assert paired([(1, 0.9), (2, 0.8), (3, 0.7)], [(0, 0.1), (2, 0.5), (3, 0.6)]) == ([0.8, 0.7], [0.5, 0.6])


@pytest.fixture
def store(tmp_path, monkeypatch):
    """Two arms x 2 seeds: 'grpo' follows R = -0.5·exp(H) + 3 exactly, 'kl_cov' R = -1·exp(H) + 4."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("entropy")
    start = 0
    for algo, (a, b) in {"grpo": (0.5, 3.0), "kl_cov": (1.0, 4.0)}.items():
        for seed in (0, 1):
            start += 1
            tags = {"rlx.overrides": f"algo={algo} seed={seed}", "rlx.algo": algo, "rlx.ablate": "none",
                    "rlx.seed": str(seed), "rlx.study": "entropy"}  # fmt: skip
            run_id = client.create_run(exp_id, tags=tags, start_time=start).info.run_id
            entropy = {step: math.log(1.0 + seed + step / 10) for step in range(1, 21)}
            metrics = [Metric("train/entropy", h, 0, step) for step, h in entropy.items()]
            metrics += [Metric("eval/accuracy", 0.1, 0, 0)]  # step 0 has no entropy: not a pair
            metrics += [Metric("eval/accuracy", -a * math.exp(entropy[s]) + b, 0, s) for s in (10, 20)]
            client.log_batch(run_id, metrics=metrics)
            client.set_terminated(run_id, "FINISHED")
    return tmp_path


def test_report_fit_prints_each_arm_and_plots(store):
    text = report_command(experiment="entropy", fit="entropy", plots=store / "fits")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert set(rows) == {"arm", "---", "grpo", "kl_cov"}
    cells = [c.strip() for c in rows["grpo"].strip("|").split("|")]
    assert cells[1:3] == ["2", "4"]  # 2 runs, 2 pairs each (steps 10 and 20)
    assert float(cells[3]) == pytest.approx(0.5) and float(cells[4]) == pytest.approx(3.0)
    assert float(cells[5]) == pytest.approx(1.0)
    cells = [c.strip() for c in rows["kl_cov"].strip("|").split("|")]
    assert float(cells[3]) == pytest.approx(1.0) and float(cells[4]) == pytest.approx(4.0)
    assert (store / "fits" / "entropy_fit.png").stat().st_size > 0


def test_report_fit_errors(store):
    with pytest.raises(UserError, match="--fit reward is not valid"):
        report_command(experiment="entropy", fit="reward")
    with pytest.raises(UserError, match="needs 'train/entropy'"):
        from rlx_cli.studies.entropy_fit import fit_report

        fit_report([], "eval/accuracy", ["eval/accuracy"], None)
