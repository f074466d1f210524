"""``rlx report``: grouping, reducing and formatting on synthetic MLflow runs; then a real sweep end to end."""

from __future__ import annotations

import io
import math

import pandas as pd
import pytest
from conftest import SHORT, mlflow_runs, rlx, rlx_here, table_rows

from rlx_cli.config.errors import UserError
from rlx_cli.studies import power
from rlx_cli.studies.comparison import compare, of_values
from rlx_cli.studies.report import report_command
from rlx_cli.studies.report_format import latex_escape
from rlx_cli.studies.run_records import reduce

FULL = "algo=vapo trainer.steps=20"
# arm -> {seed: final eval/accuracy}; the histories are [0.1 at step 0, final - 0.1 at step 10, final at step 20]
ARMS = {
    FULL: {0: 0.5, 1: 0.6, 2: 0.7},
    f"{FULL} +ablate=no_clip_higher": {0: 0.4, 1: 0.5},
    f"{FULL} +ablate=no_value_pretrain": {0: 0.3},
}


def log_run(client, exp_id, overrides, seed, final, *, status="FINISHED", start=0, study="s1", peak=None):
    from mlflow.entities import Metric

    ablate = next((t.split("=")[1] for t in overrides.split() if t.startswith("+ablate=")), "none")
    tags = {"rlx.overrides": f"{overrides} seed={seed}", "rlx.algo": "vapo", "rlx.ablate": ablate,
            "rlx.seed": str(seed), "rlx.study": study}  # fmt: skip
    run_id = client.create_run(exp_id, tags=tags, start_time=start).info.run_id
    middle = final - 0.1 if peak is None else peak
    history = [(0, 0.1), (10, middle), (20, final)]
    metrics = [
        Metric(key, scale * v, step, step)
        for step, v in history
        for key, scale in (("eval/accuracy", 1), ("train/reward", 2))
    ]
    client.log_batch(run_id, metrics=metrics)
    client.set_terminated(run_id, status)
    return run_id


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory):
    """Experiment 'ablation': three arms, a study parent, a FAILED run, a re-run seed; 'other': study s2."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('report') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("ablation")
    parent = client.create_run(exp_id, tags={"rlx.study": "s1", "rlx.role": "study", "rlx.overrides": FULL})
    client.log_metric(parent.info.run_id, "eval/accuracy", 0.99, step=20)
    client.set_terminated(parent.info.run_id, "FINISHED")
    log_run(client, exp_id, FULL, 0, 0.0, start=1)  # superseded by the re-run of seed 0 below
    start = 10
    for overrides, seeds in ARMS.items():
        for seed, final in seeds.items():
            start += 1
            log_run(client, exp_id, overrides, seed, final, start=start, peak=0.95 if seed == 2 else None)
    log_run(client, exp_id, FULL, 3, 0.99, status="FAILED", start=100)
    other = client.create_experiment("other")
    for seed in (0, 1):  # an arm whose label needs escaping in LaTeX and HTML
        log_run(client, other, "algo=vapo task.name=a&b#c%d_e", seed, 0.2 + seed / 10, study="s2", start=200 + seed)
    return uri


@pytest.fixture
def store(store_uri, tmp_path, monkeypatch):
    """The shared store as MLFLOW_TRACKING_URI, in a fresh working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    return tmp_path


def test_markdown_groups_arms_over_seeds(store):
    text = report_command(experiment="ablation")
    rows = table_rows(text)
    assert [r[0] for r in rows] == ["vapo", "vapo +ablate=no_clip_higher", "vapo +ablate=no_value_pretrain"]
    full, no_clip, no_vp = rows
    # full: mean 0.6, sample std 0.1 over 3 seeds (the FAILED run, the parent and the superseded seed 0 left out)
    assert full[1:4] == ["**0.600 ± 0.100**", "3", "baseline"]
    assert no_clip[1:4] == [f"0.450 ± {math.sqrt(0.005):.3f}", "2", "-0.150"]
    assert no_vp[1:4] == ["0.300 ± –", "1", "-0.300"]  # n = 1: no std
    assert "Δ vs vapo" in text and "common overrides: algo=vapo trainer.steps=20" in text


def test_csv_has_raw_numbers(store):
    table = pd.read_csv(io.StringIO(report_command(experiment="ablation", fmt="csv", extra_metrics="train/reward")))
    assert list(table["n"]) == [3, 2, 1]
    assert table["eval/accuracy_mean"].tolist() == pytest.approx([0.6, 0.45, 0.3])
    assert table["eval/accuracy_std"].iloc[0] == pytest.approx(0.1)
    assert math.isnan(table["eval/accuracy_std"].iloc[2])
    assert table["delta"].tolist() == pytest.approx([0.0, -0.15, -0.3])
    assert table["train/reward_mean"].tolist() == pytest.approx([1.2, 0.9, 0.6])


@pytest.mark.parametrize(("how", "expected"), [("last", 0.6), ("max", (0.5 + 0.6 + 0.95) / 3), ("mean_last_k", None)])
def test_reduce_modes(store, how, expected):
    table = pd.read_csv(io.StringIO(report_command(experiment="ablation", fmt="csv", reduce_by=how, k=2)))
    if expected is None:  # mean of the last 2 values per run: (final - 0.1 + final) / 2, seed 2 peaks at 0.95
        expected = ((0.4 + 0.5) / 2 + (0.5 + 0.6) / 2 + (0.95 + 0.7) / 2) / 3
    assert table["eval/accuracy_mean"].iloc[0] == pytest.approx(expected)


def test_seeds_keeps_only_those_seeds_in_every_arm(store):
    table = pd.read_csv(io.StringIO(report_command(experiment="ablation", fmt="csv", seeds="0,1")))
    assert list(table["n"]) == [2, 2, 1]
    assert table["eval/accuracy_mean"].tolist() == pytest.approx([0.55, 0.45, 0.3])  # full: seeds 0 and 1 only
    with pytest.raises(UserError, match=r"--seeds 7: no FINISHED run has these seeds \(seeds found: 0, 1, 2\)"):
        report_command(experiment="ablation", seeds="7")
    with pytest.raises(UserError, match="--seeds a,b is not valid"):
        report_command(experiment="ablation", seeds="a,b")


def test_reduce_of_one_history():
    points = [(0, 0.1), (10, 0.9), (20, 0.5)]
    assert reduce(points, "last", 3) == 0.5 and reduce(points, "max", 3) == 0.9
    assert reduce(points, "mean_last_k", 2) == pytest.approx(0.7) and reduce([], "last", 3) is None
    assert reduce(points, "mean_first_k", 2) == pytest.approx(0.5) and reduce(points, "mean_first_k", 9) == 0.5


def test_stats_columns(store):
    table = pd.read_csv(io.StringIO(report_command(experiment="ablation", fmt="csv", with_stats=True)))
    expected_p = of_values([0.4, 0.5], [0.5, 0.6, 0.7], paired=False, margin=0.02).p  # seeds 0, 1 against 0, 1, 2
    assert table["test"].iloc[1] == "Welch" and table["p_value"].iloc[1] == pytest.approx(expected_p)
    assert table["p_holm"].iloc[1] == pytest.approx(expected_p)  # the only arm with a test: t = 1
    assert math.isnan(table["p_value"].iloc[0]) and math.isnan(table["p_value"].iloc[2])  # baseline; n = 1
    assert table["ci_low"].iloc[1] <= -0.15 <= table["ci_high"].iloc[1] and table["detectable"].iloc[1] > 0.15
    text = report_command(experiment="ablation", with_stats=True)
    assert [r[4] for r in table_rows(text)] == ["", "Welch", "–"] and "interval of Δ" in text  # n = 1: no test
    assert f"{expected_p:.3f}" in text and "- p (Holm): p adjusted for the table: Holm's step-down over the 2" in text
    assert [r[9] for r in table_rows(text)] == ["–", "95%", "–"]  # the interval's level: 1 - α, one arm judged


# arm -> {seed: final eval/accuracy}: the first shares the baseline's seeds (paired), the second does not (Welch)
PAIRED = {
    "algo=grpo": {0: 0.61, 1: 0.70, 2: 0.64, 3: 0.69},
    "algo=grpo +ablate=no_clip_higher": {0: 0.58, 1: 0.66, 2: 0.63, 3: 0.64},
    "algo=grpo +ablate=no_token_loss": {0: 0.55, 1: 0.69, 4: 0.60},
}


@pytest.fixture(scope="module")
def paired_uri(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('paired') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("paired")
    start = 0
    for overrides, seeds in PAIRED.items():
        for seed, final in seeds.items():
            start += 1
            log_run(client, exp_id, overrides, seed, final, start=start, study="p")
    return uri


def test_stats_are_paired_on_shared_seeds_welch_otherwise_with_holm_and_mde(paired_uri, tmp_path, monkeypatch):
    scipy_stats = pytest.importorskip("scipy.stats")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", paired_uri)
    table = pd.read_csv(io.StringIO(report_command(study="p", fmt="csv", with_stats=True)))
    base, clip, token = (list(seeds.values()) for seeds in PAIRED.values())
    paired, welch = scipy_stats.ttest_rel(clip, base), scipy_stats.ttest_ind(token, base, equal_var=False)
    assert table["test"].tolist()[1:] == ["paired", "Welch"]
    assert table["p_value"].tolist()[1:] == pytest.approx([float(paired.pvalue), float(welch.pvalue)], abs=1e-9)
    # both inconclusive: the two-sided interval at the level the step-down stopped at, α / 2 arms: 97.5%
    assert table["ci_level"].tolist()[1:] == pytest.approx([0.975, 0.975])
    assert [table["ci_low"].iloc[1], table["ci_high"].iloc[1]] == pytest.approx(list(paired.confidence_interval(0.975)))
    assert [table["ci_low"].iloc[2], table["ci_high"].iloc[2]] == pytest.approx(list(welch.confidence_interval(0.975)))
    # Holm-Shaffer over 4 hypotheses, 2 arms: the paired arm's p 0.032 first, times the 2 arms holding one: 0.064
    assert table["p_holm"].iloc[1] == pytest.approx(2 * float(paired.pvalue))
    # its MDE at the level it was judged at: the step stopped at α / 2
    se = float(scipy_stats.tstd([c - b for c, b in zip(clip, base)])) / 2
    assert table["detectable"].iloc[1] == pytest.approx(power.detectable(se, 3, level=0.025))

    text = report_command(study="p", with_stats=True)
    rows = table_rows(text)
    assert [r[4] for r in rows] == ["", "paired", "Welch"]  # the test column says which test each row used
    assert text.count("\n- ") == 13 and "- MDE (80%): minimum detectable effect" in text  # a legend line per column

    planning = report_command(study="p", power=0.02)
    rows = table_rows(planning)
    sigma = float(scipy_stats.tstd([c - b for c, b in zip(clip, base)]))
    # at the level of the table's first step, α / 2 arms, from the 70% upper bound of the pilot's variance
    needed = power.seeds_needed(0.02, power.planned_variances((sigma**2,), 3), alpha=0.025)
    assert rows[0][:4] == ["vapo +ablate=no_clip_higher", "4", "paired", f"{sigma:.3f}"] and rows[0][5] == str(needed)
    assert rows[1][2] == "Welch" and f"every arm: {max(needed, int(rows[1][5]))} seeds each" in planning
    assert "seeds for Δ = 0.020" in planning and "σ of a one-seed Δ:" in planning
    csv = pd.read_csv(io.StringIO(report_command(study="p", power=0.02, fmt="csv")))
    assert csv["seeds_needed"].tolist()[0] == needed and csv["sigma"].iloc[0] == pytest.approx(sigma)
    # --seeds 0,1 pairs the second arm too
    subset = pd.read_csv(io.StringIO(report_command(study="p", fmt="csv", with_stats=True, seeds="0,1")))
    assert subset["test"].tolist()[1:] == ["paired", "paired"]
    with pytest.raises(UserError, match=r"--power 0.0 is not valid \(valid: the Δ to detect, > 0"):
        report_command(study="p", power=0.0)


def test_baseline_by_label_or_overrides(store):
    rows = table_rows(report_command(experiment="ablation", baseline="+ablate=no_clip_higher"))
    assert rows[0][0] == "vapo +ablate=no_clip_higher" and rows[0][3] == "baseline" and rows[1][3] == "+0.150"
    assert table_rows(report_command(experiment="ablation", baseline="vapo"))[0][0] == "vapo"
    with pytest.raises(UserError, match="matches 3 arms"):
        report_command(experiment="ablation", baseline="algo=vapo")


def test_arm_keeps_only_the_arms_named_in_study_order(store):
    text = report_command(experiment="ablation", arm_names=["+ablate=no_clip_higher", "vapo"], with_stats=True)
    rows = table_rows(text)
    assert [r[0] for r in rows] == ["vapo", "vapo +ablate=no_clip_higher"] and rows[1][3] == "-0.150"
    assert "over the 2 hypotheses of the 1 arm compared" in text  # Holm over the arms shown
    named = report_command(experiment="ablation", arm_names=["+ablate=no_clip_higher"], baseline="vapo")
    assert [r[0] for r in table_rows(named)] == ["vapo", "vapo +ablate=no_clip_higher"]  # the baseline joins
    with pytest.raises(UserError, match=r"--arm 'ppo' matches 0 arms \(valid: vapo; vapo \+ablate=no_clip_higher"):
        report_command(experiment="ablation", arm_names=["ppo"])


def test_minimize_bolds_the_smallest(store):
    rows = table_rows(report_command(experiment="ablation", direction="lower"))
    assert rows[2][1] == "**0.300 ± –**" and not rows[0][1].startswith("**")


def test_study_filter_and_latex_html_escaping(store):
    tex = report_command(study="s2", fmt="tex")
    assert (
        r"a\&b\#c\%d\_e" in tex and r"\textbf{0.250 $\pm$ 0.071}" in tex and r"\begin{tabular}{lrrrr}" in tex
    )  # arm, mean, n, Δ, health
    assert latex_escape("50% of x_1 & #2 {y}") == r"50\% of x\_1 \& \#2 \{y\}"
    html = report_command(study="s2", fmt="html")
    assert "a&amp;b#c%d_e" in html and "<b>0.250 ± 0.071</b>" in html
    assert len(table_rows(report_command(study="s1"))) == 3  # the study spans the arms of 'ablation' only


def test_plots_are_written(store):
    report_command(experiment="ablation", plots=store / "curves", extra_metrics="train/reward")
    for name in ("eval_accuracy.png", "train_reward.png"):
        png = (store / "curves" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_out_file(store):
    report_command(experiment="ablation", out=store / "reports" / "table.md")
    assert "**0.600 ± 0.100**" in (store / "reports" / "table.md").read_text()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"experiment": "nope"}, ["unknown experiment 'nope'", "ablation", "Default"]),
        ({"study": "nope"}, ["no FINISHED runs in study 'nope'", "studies: s1"]),
        ({}, ["--experiment", "ablation"]),
        ({"experiment": "ablation", "metric": "eval/nope"}, ["eval/nope", "eval/accuracy", "train/reward"]),
        ({"experiment": "ablation", "fmt": "pdf"}, ["--format pdf", "md, csv, tex, html"]),
        ({"experiment": "ablation", "reduce_by": "min"}, ["--reduce min", "mean_last_k"]),
    ],
)
def test_mistakes_are_one_line(store, kwargs, named):
    with pytest.raises(UserError) as error:
        report_command(**kwargs)
    message = str(error.value)
    assert "\n" not in message
    for text in named:
        assert text in message


def test_cli_unknown_experiment_exits_2(store):
    out = rlx("report", "--experiment", "nope", cwd=store)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "ablation" in out.stderr


def test_no_store_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'none.db'}")
    with pytest.raises(UserError, match="no MLflow store"):
        report_command(experiment="rlx")
    assert not (tmp_path / "none.db").exists()


@pytest.mark.slow
def test_sweep_then_report_acceptance_1(workdir):
    """Acceptance 1: a 2 x 2 sweep with 2 jobs -> 4 FINISHED runs; the report has 2 rows with n = 2; CSV round-trips."""
    steps = ["trainer.steps=4" if a.startswith("trainer.steps=") else a for a in SHORT]  # the fit needs 4 points
    args = ["algo=grpo", "policy_loss.eps_high=0.2,0.28", "seed=0,1", *steps]
    out = rlx("sweep", *args, "--jobs", "2", "--study", "acc1", cwd=workdir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 finished, 0 failed, 0 skipped" in out.stdout
    runs = mlflow_runs(workdir)
    children = runs[runs["tags.rlx.role"] != "study"]
    parent = runs[runs["tags.rlx.role"] == "study"]
    assert len(children) == 4 and set(children["status"]) == {"FINISHED"} and len(parent) == 1
    assert set(children["tags.mlflow.parentRunId"]) == {parent["run_id"].iloc[0]}
    assert set(children["tags.rlx.study"]) == {"acc1"} and parent["status"].iloc[0] == "FINISHED"

    md = rlx_here("report", "--experiment", "rlx", cwd=workdir)
    assert md.returncode == 0, md.stderr
    rows = table_rows(md.stdout)
    assert [r[0] for r in rows] == ["grpo policy_loss.eps_high=0.2", "grpo policy_loss.eps_high=0.28"]
    assert [r[2] for r in rows] == ["2", "2"] and rows[0][3] == "baseline" and "±" in rows[1][1]

    csv = rlx_here("report", "--experiment", "rlx", "--format", "csv", cwd=workdir)
    table = pd.read_csv(io.StringIO(csv.stdout))
    for row, (mean, std) in zip(rows, table[["eval/accuracy_mean", "eval/accuracy_std"]].values):
        assert row[1].strip("*") == f"{mean:.3f} ± {std:.3f}"
    by_arm = children.groupby("params.policy_loss.eps_high")["metrics.eval/accuracy"].mean()
    assert table["eval/accuracy_mean"].tolist() == pytest.approx([by_arm["0.2"], by_arm["0.28"]])
    assert table["delta"].iloc[1] == pytest.approx(by_arm["0.28"] - by_arm["0.2"])

    again = rlx_here("sweep", *args, "--jobs", "2", "--study", "acc1", cwd=workdir)  # nothing to start
    assert again.returncode == 0 and "0 finished, 0 failed, 4 skipped" in again.stdout, again.stdout
    assert len(mlflow_runs(workdir)) == 5

    # at equal samples, with ScaleRL's fit (train/reward: a point at every step, x = the samples drawn so far)
    fit = ("report", "--experiment", "rlx", "--x", "samples", "--fit", "sigmoid", "--metric", "train/reward")
    out = rlx_here(*fit, "--out", "rep/fit.md", "--plots", "rep", cwd=workdir)
    assert out.returncode == 0, out.stderr
    text = (workdir / "rep" / "fit.md").read_text()
    assert "C = samples" in text and "| grpo policy_loss.eps_high=0.28 |" in text and "ΔA vs" in text
    per_run = pd.read_csv(workdir / "rep" / "fit-runs.csv")
    assert len(per_run) == 4 and set(per_run["seed"]) == {0, 1}
    curves = pd.read_csv(workdir / "rep" / "fit-curves.csv")
    assert sorted(set(curves["x"])) == [i * 4 * 8 for i in range(1, 5)]  # 4 prompts x 8 answers a step
    for name in ("fit-fits.csv", "fit-sigmoid.png", "train_reward.png"):
        assert (workdir / "rep" / name).is_file()


def test_a_delta_prints_at_its_columns_precision():
    from rlx_cli.studies.report_format import mean_std, num, signed

    assert signed(-0.000587, 0.75) == "-0.001"  # a Δ of accuracies: 3 decimals like the accuracies
    assert signed(0.0009, 0.75) == "+0.001"
    assert mean_std(0.742, 0.000833, 0.742) == "0.742 ± 0.001"
    assert mean_std(float("nan"), float("nan")) == "–"  # an arm that does not log the metric
    assert num(0.000833) == "0.000833"  # on its own: 3 significant figures below 0.001
    assert num(2e-6, 1e-5) == "2e-06"  # a column of small values (learning rates) keeps its figures
    assert num(12345.0, 12345.0) == "12,345"  # counts (samples drawn) as whole numbers


def test_verdicts_are_labelled_on_holm_adjusted_p_and_tost(paired_uri, monkeypatch):
    """The paired arm: Δ = -0.0325, p = 0.032 alone, 0.064 after Holm over the two arms; TOST against ±0.1 gives
    p = 0.0021 (0.0042 after Holm): equivalent at α = 0.05 with δ = 0.1, inconclusive with δ = 0.05 (TOST's p 0.066),
    worse at α = 0.1 (0.064 < 0.1). The Welch arm (p = 0.38) stays inconclusive, with the seeds that would decide."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", paired_uri)

    def table(**options) -> pd.DataFrame:
        return pd.read_csv(io.StringIO(report_command(study="p", fmt="csv", with_stats=True, **options)))

    wide = table(margin=0.1)
    assert wide["p_value"].iloc[1] == pytest.approx(0.031874195, abs=1e-8)
    # one family of 4 hypotheses: TOST's 0.0021 first (x 2 arms), then Δ = 0's 0.032 (x 2: the arm's Δ = 0 and the
    # other arm's two are left, one an arm at most true)
    assert wide["p_holm"].iloc[1] == pytest.approx(2 * 0.031874195, abs=1e-8)
    assert wide["p_equivalent"].iloc[1] == pytest.approx(0.0021100749, abs=1e-9)
    assert wide["p_equivalent_holm"].iloc[1] == pytest.approx(2 * 0.0021100749, abs=1e-9)
    assert wide["verdict"].tolist()[1:] == ["equivalent", "inconclusive"]
    assert wide["ci_level"].iloc[1] == pytest.approx(0.95)  # TOST at α/2: its 1 - 2 · 0.025 interval
    base = list(PAIRED["algo=grpo"].values())
    welch = compare(dict(zip("014", PAIRED["algo=grpo +ablate=no_token_loss"].values())), dict(zip("0123", base)),
                    margin=0.1)  # fmt: skip
    expected = power.seeds_to_decide(welch.delta, welch.variances, welch.n, welch.df, margin=0.1, level=0.025)
    assert wide["seeds_needed"].iloc[2] == expected > 3
    assert table(margin=0.05)["verdict"].tolist()[1:] == ["inconclusive", "inconclusive"]
    assert table(margin=0.05, alpha=0.1)["verdict"].iloc[1] == "worse"
    text = report_command(study="p", with_stats=True, margin=0.1, alpha=0.1)
    assert "verdicts at α = 0.1 against a margin δ = 0.100 in eval/accuracy's units, higher is better" in text
    verdicts = [row[11] for row in table_rows(text)]  # p_holm 0.064 < 0.1 and TOST's 0.0042: worse, within ±0.1
    assert verdicts[1] == "worse (within δ)" and verdicts[2].startswith("inconclusive (")
    with pytest.raises(UserError, match=r"--margin 0.0 is not valid \(valid: > 0"):
        report_command(study="p", margin=0.0)
    with pytest.raises(UserError, match=r"--alpha 1.0 is not valid"):
        report_command(study="p", alpha=1.0)
    with pytest.raises(UserError, match=r"--alpha 0.5 is not valid \(valid: above 0 and below 0.5"):
        report_command(study="p", alpha=0.5)
