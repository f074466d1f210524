"""Reports at equal compute (``rlx report --x``), the per-run data beside a report, and unbiased pass@k."""

from __future__ import annotations

import math
import os

import pandas as pd
import pytest

from rlx_cli.config.errors import UserError
from rlx_cli.loops.evaluation import pass_at_k
from rlx_cli.studies import compute_axis
from rlx_cli.studies.report import report_command


def test_curve_on_an_axis_cut_at_a_budget_and_its_area():
    points = [(0, 0.1), (1, 0.3), (2, 0.5), (3, 0.9)]
    spent = [(0, 0.0), (1, 64.0), (2, 128.0)]  # step 3 logged no x: left out
    curve = compute_axis.on_axis(points, spent)
    assert curve == [(0.0, 0.1), (64.0, 0.3), (128.0, 0.5)]
    assert compute_axis.common_budget([curve, [(0.0, 0.2), (96.0, 0.4)]]) == 96.0
    cut = compute_axis.cut(curve, 96.0)
    assert cut[:2] == curve[:2] and cut[2] == (96.0, pytest.approx(0.4))  # halfway from 0.3 to 0.5
    assert compute_axis.cut(curve, 64.0) == curve[:2]  # a point at the budget: no interpolation
    # trapezoids: 64·(0.1 + 0.3)/2 + 32·(0.3 + 0.4)/2 = 12.8 + 11.2 = 24, over a range of 96
    assert compute_axis.area(cut) == pytest.approx(24 / 96)
    assert compute_axis.area([(5.0, 0.7)]) == 0.7 and math.isnan(compute_axis.area([]))
    with pytest.raises(UserError, match="--x flops is not valid .*samples"):
        compute_axis.check_axis("flops")


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3, 2) / C(5, 2)
        (10, 1, 3, 1 - 84 / 120),  # 1 - C(9, 3) / C(10, 3)
        (4, 0, 4, 0.0),
        (3, 3, 2, 1.0),
        (4, 2, 3, 1.0),  # C(2, 3) = 0: any 3 of 4 hold one of the 2 correct
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def log_curve(client, exp_id, overrides: str, seed: int, points, start: int) -> str:
    """A FINISHED run whose eval/accuracy and perf/samples are ``points`` [(step, samples, accuracy)]."""
    from mlflow.entities import Metric

    tags = {"rlx.overrides": f"{overrides} seed={seed}", "rlx.algo": overrides.split("=")[1].split()[0],
            "rlx.ablate": "none", "rlx.seed": str(seed)}  # fmt: skip
    run_id = client.create_run(exp_id, tags=tags, start_time=start).info.run_id
    metrics = [Metric("eval/accuracy", acc, step, step) for step, _, acc in points]
    metrics += [Metric("perf/samples", samples, step, step) for step, samples, _ in points]
    client.log_batch(run_id, metrics=metrics)
    client.set_terminated(run_id, "FINISHED")
    return run_id


@pytest.fixture
def compute_store(tmp_path, monkeypatch):
    """'grpo' samples 100 answers a step, 'dapo' 200 (dynamic sampling's extra draws); both rise linearly."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("compute")
    for seed in (0, 1):
        log_curve(client, exp_id, "algo=grpo", seed, [(s, 100.0 * s, 0.1 * s + seed / 100) for s in range(5)], seed)
        log_curve(client, exp_id, "algo=dapo", seed, [(s, 200.0 * s, 0.15 * s + seed / 100) for s in range(5)], 9)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return tmp_path


def test_arms_at_equal_samples_with_per_run_data(compute_store):
    """At the last step dapo leads (0.6 vs 0.4); at grpo's 400 samples, dapo's step 2, it trails (0.3 vs 0.4)."""
    out = compute_store / "report" / "table.md"
    report_command(experiment="compute", fmt="csv", x="samples", out=out, plots=compute_store / "plots")
    table = pd.read_csv(out)
    means = dict(zip(table["arm"], table["eval/accuracy_mean"]))
    assert means["grpo"] == pytest.approx(0.405) and means["dapo"] == pytest.approx(0.305)
    # AUC over [0, 400]: grpo rises 0 -> 0.4 (mean height 0.2), dapo 0 -> 0.3 (0.15); + seed / 100 on average 0.005
    aucs = dict(zip(table["arm"], table["AUC of eval/accuracy_mean"]))
    assert aucs["grpo"] == pytest.approx(0.205) and aucs["dapo"] == pytest.approx(0.155)
    drawn = dict(zip(table["arm"], table["samples drawn_mean"]))
    assert drawn == {"grpo": 400.0, "dapo": 800.0}
    runs = pd.read_csv(compute_store / "report" / "table-runs.csv")
    assert len(runs) == 4 and set(runs.columns) >= {"arm", "seed", "run_id", "eval/accuracy"}
    by_run = runs.set_index(["arm", "seed"])["eval/accuracy"]
    assert by_run["dapo", 1] == pytest.approx(0.31) and by_run["grpo", 0] == pytest.approx(0.4)
    curves = pd.read_csv(compute_store / "report" / "table-curves.csv")
    dapo0 = curves[(curves["arm"] == "dapo") & (curves["seed"] == 0) & (curves["metric"] == "eval/accuracy")]
    assert dapo0["x"].tolist() == [0, 200, 400] and dapo0["value"].tolist() == pytest.approx([0, 0.15, 0.3])
    assert (compute_store / "plots" / "eval_accuracy.png").read_bytes().startswith(b"\x89PNG")
    md = report_command(experiment="compute", x="samples")
    assert "at equal answers sampled: every run's curve cut at samples = 400" in md


def test_an_arm_with_no_point_before_the_budget_is_named_in_the_caption(compute_store):
    """'vapo' pretrains its critic on 1,000 answers before its first evaluation: past grpo's and dapo's budget."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    exp_id = client.get_experiment_by_name("compute").experiment_id
    log_curve(client, exp_id, "algo=vapo", 0, [(s, 1000.0 + 100 * s, 0.2) for s in range(5)], 20)
    md = report_command(experiment="compute", x="samples")
    assert "runs of vapo have no point before the budget (their first evaluation comes after samples = 400" in md
    assert "no point before the budget" not in report_command(experiment="compute", x="step")


def test_an_axis_the_runs_did_not_log_is_one_line(compute_store):
    with pytest.raises(UserError, match=r"--x tokens: some runs did not log perf/tokens .*valid: --x step"):
        report_command(experiment="compute", x="tokens")


@pytest.mark.slow
def test_a_run_logs_its_compute_and_pass_at_k(workdir):
    """DAPO's dynamic sampling: every draw's answers count; pass@1 is eval/accuracy_sampled; train tokens = epochs x
    the tokens of the batch trained on (overlong filtering off); eval.max_new_tokens caps evaluation's answers only."""
    import json

    from conftest import SHORT, mlflow_runs, rlx

    args = [*SHORT, "algo=dapo", "reward_shaping=none", "trainer.epochs=2", "eval.samples=3", "eval.pass_k=[1,3]"]
    out = rlx("train", *args, "eval.max_new_tokens=1", "trainer.output_dir=out", cwd=workdir)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = json.loads((workdir / "out" / "metrics.json").read_text())
    assert metrics["eval/pass_at_1"] == pytest.approx(metrics["eval/accuracy_sampled"], abs=1e-12)
    assert metrics["eval/pass_at_1"] <= metrics["eval/pass_at_3"] <= 1.0
    assert metrics["eval/response_len"] <= 1.0 < metrics["train/response_len"]  # an answer and EOS: 2 tokens or more
    from mlflow.tracking import MlflowClient

    run_id = mlflow_runs(workdir)["run_id"].iloc[0]
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    history = {key: {m.step: m.value for m in client.get_metric_history(run_id, key)}
               for key in ("perf/samples", "perf/tokens", "perf/train_tokens", "perf/wall_s", "train/draws",
                           "train/sampled", "train/sampled_tokens", "train/groups", "train/response_len")}  # fmt: skip
    assert history["perf/samples"][0] == 0 and sorted(history["perf/samples"]) == [0, 1, 2, 3]
    group = 8  # rollout.group_size
    for step in (1, 2, 3):
        drawn = history["train/draws"][step] * 4 * group  # every draw samples prompts_per_step = 4 groups
        assert history["train/sampled"][step] == drawn
        assert history["perf/samples"][step] == sum(history["train/sampled"][s] for s in range(1, step + 1))
        assert history["perf/tokens"][step] == sum(history["train/sampled_tokens"][s] for s in range(1, step + 1))
        trained = history["train/groups"][step] * group * history["train/response_len"][step]  # the kept rows
        added = history["perf/train_tokens"][step] - history["perf/train_tokens"].get(step - 1, 0.0)
        assert added == pytest.approx(2 * trained)  # two epochs
        assert history["perf/wall_s"][step] > history["perf/wall_s"][step - 1]


def sigmoid(c: float, a: float, b: float = 1.5, c_mid: float = 800.0, r0: float = 0.2) -> float:
    return r0 + (a - r0) / (1 + (c_mid / c) ** b) if c > 0 else r0


@pytest.fixture
def scaling_store(tmp_path, monkeypatch):
    """'grpo' saturates at A = 0.8 ± 0.01, 'rloo' at 0.6 + 0.01 on seeds 0 and 2 (B 1.5, C_mid 800 samples, R0 0.2),
    so that the paired differences vary with the seed; 16 evaluations every 100 samples."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("scaling")
    for seed, wobble in enumerate((-0.01, 0.0, 0.01)):
        for algo, a in (("grpo", 0.8 + wobble), ("rloo", 0.6 + wobble * wobble * 100)):  # rloo: 0.61, 0.6, 0.61
            points = [(s, 100.0 * s, sigmoid(100.0 * s, a)) for s in range(17)]
            log_curve(client, exp_id, f"algo={algo}", seed, points, seed)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return tmp_path


def test_fit_sigmoid_over_samples_recovers_each_arm_and_the_difference(scaling_store):
    out = scaling_store / "fit.md"
    plots = scaling_store / "plots"
    text = report_command(experiment="scaling", x="samples", fit="sigmoid", baseline="grpo", out=out, plots=plots)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| grpo") or line.startswith("| rloo")}  # fmt: skip
    assert float(rows["grpo"][1].split()[0]) == pytest.approx(0.8, abs=0.002)
    assert float(rows["rloo"][1].split()[0]) == pytest.approx(0.6067, abs=0.002)
    assert float(rows["grpo"][2].split()[0]) == pytest.approx(1.5, rel=0.02)
    assert float(rows["rloo"][3].split()[0]) == pytest.approx(800, rel=0.02)
    delta, low, high = (float(v.strip("[],")) for v in rows["rloo"][5].split())
    assert delta == pytest.approx(-0.1933, abs=0.003) and low < delta < high < 0  # per-seed Δ: -0.18, -0.2, -0.2
    assert float(rows["grpo"][-1]) < 0.01  # the first half predicts the last point
    fits = pd.read_csv(scaling_store / "fit-fits.csv")
    assert len(fits) == 6 and fits.groupby("arm")["a"].mean().round(3).to_dict() == {"grpo": 0.8, "rloo": 0.607}
    assert (scaling_store / "plots" / "fit-sigmoid.png").read_bytes().startswith(b"\x89PNG")


def test_fit_sigmoid_with_too_few_points_is_one_line(compute_store):
    with pytest.raises(UserError, match=r"at least 4 points after --fit-from 200 \(run 1 of 2 has 3\)"):
        report_command(experiment="compute", x="samples", fit="sigmoid", fit_from=200)


def test_an_override_with_spaces_is_one_override_in_tags_labels_and_identity(tmp_path, monkeypatch):
    """``'task.config={min_terms: 2, max_terms: 3}'`` (task=gym's difficulty) is one override: the tag is shell words,
    the arms' labels and the common overrides quote it, and a point's identity is the same from its list and tag."""
    import shlex

    from mlflow.tracking import MlflowClient

    from rlx_cli.studies import study

    easy, hard = "task.config={min_terms: 2, max_terms: 3}", "task.config={min_terms: 3, max_terms: 4}"
    assert study.canonical(shlex.join(["algo=grpo", easy])) == study.canonical(["algo=grpo", easy])
    assert study.override_tokens(shlex.join(["b=1", easy])) == ["b=1", easy]
    assert study.override_tokens("a=1 it's") == ["a=1", "it's"]  # not shell words: split at spaces
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("gym")
    for seed in (0, 1):
        for config in (easy, hard):
            overrides = shlex.join(["algo=grpo", "task=gym", config])
            log_curve(client, exp_id, overrides, seed, [(s, 100.0 * s, 0.1 * s) for s in range(3)], seed)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    md = report_command(experiment="gym")
    assert f"grpo {shlex.quote(easy)} " in md and f"grpo {shlex.quote(hard)} " in md
    footer = next(line for line in md.splitlines() if "common overrides:" in line)
    assert footer.endswith("common overrides: algo=grpo task=gym"), footer
