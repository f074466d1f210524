"""``rlx sweep`` / ``rlx ablate``: Hydra expansion, overlay filtering, dry runs, mistakes; then real parallel sweeps."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHORT, mlflow_runs, rlx, rlx_here

from rlx_cli.config.errors import UserError
from rlx_cli.studies import study, sweep
from rlx_cli.studies.launchers import check_launcher


def test_expand_follows_hydra_multirun():
    points = sweep.expand(["a=1,2", "b=x", "seed=range(2)"])
    assert points == [
        ["a=1", "b=x", "seed=0"],
        ["a=1", "b=x", "seed=1"],
        ["a=2", "b=x", "seed=0"],
        ["a=2", "b=x", "seed=1"],
    ]
    assert sweep.expand(["lr=choice(0.1,0.2)", "+ablate=no_x"]) == [
        ["lr=0.1", "+ablate=no_x"],
        ["lr=0.2", "+ablate=no_x"],
    ]
    assert ["algo=grpo"] in sweep.expand(["algo=glob(*)"])  # glob over a config group's choices
    assert sweep.expand([]) == [[]]


@pytest.mark.parametrize(("args", "named"), [(["x=interval(0,1)"], "interval()"), (["a=[1,"], "cannot parse override")])
def test_expand_mistakes(args, named):
    with pytest.raises(UserError, match=named.replace("(", r"\(").replace(")", r"\)")):
        sweep.expand(args)


def test_canonical_ignores_order_output_dir_and_resume():
    assert study.canonical(["b=2", "a=1", "trainer.output_dir=x/001", "trainer.resume=true"]) == "a=1 b=2"
    assert study.canonical("a=1 trainer.output_dir=y b=2") == study.canonical(["b=2", "a=1"])


def test_each_point_has_a_stable_folder_of_its_own():
    point = study.Point(7, ["seed=1", "algo=grpo"], "grpo", "none", 1, "rlx", True, 3)
    folder = study.point_folder(point, "s")
    assert folder.parent == Path("outputs/sweeps/s") and folder.name.startswith("grpo-s1-")
    assert study.worker_overrides(point, folder) == [
        "seed=1",
        "algo=grpo",
        f"trainer.output_dir={folder}",
        "trainer.resume=true",
    ]
    # the same point in another order, or launched again with an output folder or a resume: the same folder
    again = study.Point(0, ["algo=grpo", "trainer.resume=false", "seed=1"], "grpo", "none", 1, "rlx", True, 3)
    assert study.point_folder(again, "s") == folder
    other = study.Point(7, ["seed=2", "algo=grpo"], "grpo", "none", 2, "rlx", True, 3)
    assert study.point_folder(other, "s") != folder
    given = study.Point(3, ["trainer.output_dir=runs", "seed=1"], "vapo", "no_a,no_b", 1, "rlx", True, 3)
    assert str(study.point_folder(given, "s")).startswith("runs/s/vapo+no_a+no_b-s1-")


def test_a_seeds_point_is_its_own_composition_composed_once(monkeypatch):
    """compose() composes the points that differ by their seed alone once (what sweep.plan asks of it for every
    point of a grid): each copy equals its own uncached composition; a bad seed is refused by the point."""
    from rlx_cli.config import compose as composing
    from rlx_cli.config.compose import flat, job_config

    points = [["algo=vapo", "+ablate=no_token_loss", f"seed={s}"] for s in (0, 7)] + [["algo=grpo", "seed=3"]]
    calls, uncached = [], composing.composed
    monkeypatch.setattr(composing, "_COMPOSED", {})
    monkeypatch.setattr(composing, "composed", lambda o: calls.append(o) or uncached(o))
    for point in points:
        assert flat(job_config(composing.compose(point))) == flat(job_config(uncached(point)))
    assert calls == [["algo=vapo", "+ablate=no_token_loss"], ["algo=vapo"], ["algo=grpo"]]  # the preset once too
    with pytest.raises(
        UserError, match=r"^seed='x' has the wrong type \(valid: int\) \(in the point: algo=grpo seed=x\)$"
    ):
        sweep.plan([["algo=grpo", "seed=0"], ["algo=grpo", "seed=x"]])


def test_workers_get_an_absolute_tracking_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    assert sweep.worker_uri() == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert sweep.worker_uri() == "http://127.0.0.1:5000"
    env = sweep.worker_env("s", "parent123", jobs=2)
    assert env["RLX_STUDY"] == "s" and env["RLX_PARENT_RUN_ID"] == "parent123" and int(env["OMP_NUM_THREADS"]) >= 1


def test_ablate_keeps_the_overlays_that_apply(monkeypatch):
    import rlx_cli.config.validate
    from rlx_cli.studies import grid

    # noop is a control (the baseline's update up to rounding), not an ingredient: rlx ablate leaves it out
    monkeypatch.setattr(grid, "group_choices", lambda: {"ablate": ["no_a", "no_b", "no_c", "noop"]})

    def fake_compose(overrides):
        if "+ablate=no_b" in overrides:
            raise UserError("ablate no_b does not apply to this preset")
        return {"overrides": overrides}

    def fake_validate(cfg):
        if "+ablate=no_c" in cfg["overrides"]:
            raise UserError("lam_schedule.critic_lam: no critic here")

    monkeypatch.setattr(grid, "compose", fake_compose)
    monkeypatch.setattr(rlx_cli.config.validate, "validate", fake_validate)
    assert sweep.applicable_overlays(["algo=x"]) == ["no_a"]
    assert sweep.ablate_points(["algo=x", "trainer.steps=5"], seeds=2) == [
        ["algo=x", "trainer.steps=5", "seed=0"],
        ["algo=x", "trainer.steps=5", "seed=1"],
        ["algo=x", "trainer.steps=5", "+ablate=no_a", "seed=0"],
        ["algo=x", "trainer.steps=5", "+ablate=no_a", "seed=1"],
    ]
    # a seed override replaces --seeds
    assert [p[-1] for p in sweep.ablate_points(["algo=x", "seed=5,6"], seeds=3)] == ["seed=5", "seed=6"] * 2
    with pytest.raises(UserError, match="adds each"):
        sweep.ablate_points(["algo=x", "+ablate=no_a"], seeds=1)


@pytest.mark.parametrize("package", ["ray", "submitit"])
def test_a_missing_cluster_package_is_one_line(monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if it were not installed
    with pytest.raises(UserError, match=r"install rlx\[cluster\]"):
        check_launcher(package)


def test_dry_run_prints_the_points_and_writes_nothing(workdir):
    out = rlx_here("sweep", "algo=grpo", "policy_loss.eps_high=0.2,0.28", "seed=0,1", "--dry-run", cwd=workdir)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("rlx sweep: 4 runs in study 'grpo-sweep-")
    assert lines[1].split() == ["000", "algo=grpo", "policy_loss.eps_high=0.2", "seed=0"]
    assert lines[4].split() == ["003", "algo=grpo", "policy_loss.eps_high=0.28", "seed=1"]
    assert not (workdir / "mlflow.db").exists() and not (workdir / "outputs").exists()


def test_ablate_dry_run_on_the_presets(workdir):
    out = rlx_here("ablate", "algo=vapo", "--seeds", "2", "--dry-run", cwd=workdir)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    count = int(lines[0].split(": ")[1].split()[0])
    points = [line.split()[1:] for line in lines[1:]]
    assert count == len(points) and count % 2 == 0 and count >= 2
    assert "study 'vapo-ablation', experiment 'vapo-ablation'" in lines[0]
    assert points[0] == ["algo=vapo", "tracking.experiment=vapo-ablation", "seed=0"]
    overlays = {t for p in points for t in p if t.startswith("+ablate=")}
    assert all(sum(f"+ablate={o.split('=')[1]}" in p for p in points) == 2 for o in overlays)
    assert not (workdir / "mlflow.db").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["trainer.steps=1,0"], ["trainer.steps=0", "in the point"]),
        (["--jobs", "0"], ["--jobs 0"]),
        (["--launcher", "slurm"], ["slurm", "local, submitit, ray"]),
        (["--nope"], ["--nope"]),
        (["--study", "a b"], ["--study 'a b'"]),
    ],
)
def test_sweep_mistakes_exit_2_and_write_nothing(workdir, args, named):
    run = rlx if args == ["--nope"] else rlx_here  # one in a process of its own: the exit code a shell sees
    out = run("sweep", "trainer.steps=1", *args, cwd=workdir)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    for text in named:
        assert text in out.stderr
    assert not (workdir / "mlflow.db").exists()


def metric_steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_eight_parallel_jobs_on_one_fresh_sqlite_store_lose_nothing(workdir):
    """Acceptance 2: 8 local jobs, one SQLite store created by the sweep: every run and every metric step lands."""
    from mlflow.tracking import MlflowClient

    short = ["trainer.steps=2", *[a for a in SHORT if not a.startswith("trainer.steps=")]]
    out = rlx("sweep", "seed=range(8)", *short, "--jobs", "8", "--no-report", cwd=workdir)  # its table unread
    assert out.returncode == 0, out.stdout + out.stderr
    assert "8 finished, 0 failed, 0 skipped" in out.stdout
    runs = mlflow_runs(workdir)
    children = runs[runs["tags.rlx.role"] != "study"]
    assert len(children) == 8 and set(children["status"]) == {"FINISHED"}
    assert sorted(children["tags.rlx.seed"].astype(int)) == list(range(8))
    assert children["tags.mlflow.parentRunId"].nunique() == 1
    client = MlflowClient()
    keys = [{k for k in client.get_run(r).data.metrics} for r in children["run_id"]]
    assert all(k == keys[0] for k in keys) and {"train/reward", "eval/accuracy", "perf/step_s"} <= keys[0]
    for run_id in children["run_id"]:
        assert metric_steps(client, run_id, "train/reward") == [1, 2]
        assert metric_steps(client, run_id, "train/loss") == [1, 2]
        assert metric_steps(client, run_id, "eval/accuracy") == [0, 2]
        assert len(client.get_run(run_id).data.params) == len(client.get_run(children["run_id"].iloc[0]).data.params)


@pytest.mark.slow
def test_ray_launcher_on_a_local_cluster_records_failures(workdir):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'rlx[cluster]')")
    short = ["trainer.steps=1", *[a for a in SHORT if not a.startswith("trainer.steps=")]]
    broken = workdir / "broken"  # passes validation (it has a config.json), fails when the worker loads it
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    out = rlx("sweep", f"model.path=null,{broken}", *short, "--launcher", "ray", "--jobs", "2", cwd=workdir)
    assert out.returncode == 1, out.stdout + out.stderr  # one point failed
    assert "1 finished, 1 failed, 0 skipped" in out.stdout and "ray" in out.stdout
    runs = mlflow_runs(workdir)
    children = runs[runs["tags.rlx.role"] != "study"].set_index("tags.rlx.overrides")
    assert sorted(children["status"]) == ["FAILED", "FINISHED"]
    failed = children[children["status"] == "FAILED"].iloc[0]
    assert "broken" in failed["tags.rlx.error"] and isinstance(failed["tags.mlflow.parentRunId"], str)
    assert runs[runs["tags.rlx.role"] == "study"]["status"].iloc[0] == "FAILED"


@pytest.mark.slow
def test_submitit_launcher_in_its_local_executor(workdir):
    pytest.importorskip("submitit", reason="submitit is not installed (pip install 'rlx[cluster]')")
    short = ["trainer.steps=1", *[a for a in SHORT if not a.startswith("trainer.steps=")]]
    out = rlx("sweep", *short, "--launcher", "submitit", cwd=workdir, env={"RLX_SUBMITIT_CLUSTER": "local"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 finished, 0 failed, 0 skipped" in out.stdout and "submitit (local)" in out.stdout
    runs = mlflow_runs(workdir)
    assert sorted(runs["status"]) == ["FINISHED", "FINISHED"]  # the study's parent and its one child
    assert list((workdir / "outputs" / "sweeps").glob("*/submitit"))


def table_of(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """A markdown table in ``text`` -> (its headers, arm -> its cells)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return cells[0], {row[0]: row for row in cells[2:]}


@pytest.mark.slow
def test_a_sweep_ends_with_its_table_where_a_far_too_high_rate_is_flagged_collapsed(workdir):
    """Acceptance 2 of the verdicts: two arms of the default, 2 seeds each, one with a learning rate 1000 times the
    model's (1e-5): the table the sweep prints at its end and rlx report both show verdict, eval SE and health, and
    only the fast arm is collapsed (its accuracies fall to 0 from the step-0 evaluation)."""
    args = ["trainer.lr=1e-5,0.01", "seed=0,1", *SHORT]
    out = rlx("sweep", *args, "--jobs", "2", "--study", "health", cwd=workdir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 finished, 0 failed, 0 skipped" in out.stdout
    folder = workdir / "outputs" / "sweeps" / "health"
    for text in (out.stdout, (folder / "table.md").read_text()):
        headers, rows = table_of(text)
        assert headers[1] == "eval/accuracy_sampled" and {"verdict", "eval SE", "health"} <= set(headers)
        fast, default = rows["grpo trainer.lr=0.01"], rows["grpo trainer.lr=1e-05"]  # as Hydra writes 1e-5
        health = headers.index("health")
        assert "collapsed" in fast[health].split(", ") and "collapsed" not in default[health]
        assert float(fast[headers.index("eval SE")]) >= 0 and float(default[headers.index("eval SE")]) > 0
        collapse = r"health of grpo trainer.lr=0.01: collapsed \(seed [01]: eval/accuracy(_sampled)? 0\.\d+ → 0\.000"
        assert re.search(collapse, text)
    table = pd.read_csv(folder / "table.csv")
    assert {"verdict", "eval_se", "health", "p_equivalent_holm"} <= set(table.columns)
    runs = pd.read_csv(folder / "table-runs.csv")
    assert len(runs) == 4 and {"status", "eval/accuracy_sampled_se", "eval/accuracy start"} <= set(runs.columns)

    report = rlx_here("report", "--study", "health", "--stats", "--metric", "eval/accuracy", cwd=workdir)
    headers, rows = table_of(report.stdout)
    assert report.returncode == 0 and {"verdict", "eval SE", "health"} <= set(headers)
    assert "collapsed" in rows["grpo trainer.lr=0.01"][headers.index("health")]
    again = rlx_here("report", "--runs", str(folder / "table-runs.csv"), "--stats", cwd=workdir)
    assert table_of(again.stdout) == table_of(out.stdout)  # the same table from the file alone

    quiet = rlx("sweep", *args, "--study", "health", "--no-report", cwd=workdir)
    assert quiet.returncode == 0 and "0 finished, 0 failed, 4 skipped" in quiet.stdout
    assert "| arm" not in quiet.stdout and "rlx report --study health --stats" in quiet.stdout
