"""The CLI as a newcomer uses it: help, printing the config and short runs on the default.

Mistakes in the input have their own table: tests/test_bad_input.py.
"""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import SHORT, mlflow_runs, rlx, rlx_together


def test_help_lists_config_groups_and_choices(workdir):
    out = rlx("--help", cwd=workdir)
    assert out.returncode == 0
    for text in ("train", "ls", "algo", "advantage", "gae", "grpo", "lam_schedule", "length_adaptive"):
        assert text in out.stdout
    train_help = rlx("train", "--help", cwd=workdir)
    assert train_help.returncode == 0 and "overrides" in train_help.stdout and "loss_agg" in train_help.stdout


def test_cfg_job_prints_yaml_and_exits(workdir):
    out = rlx("train", "algo=grpo", "--cfg", "job", "seed=7", cwd=workdir)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["seed"] == 7 and cfg["advantage"]["name"] == "grpo" and "hydra" not in cfg
    assert not (workdir / "mlflow.db").exists()


def test_ls_lists_components_with_hyperparameters(workdir):
    out = rlx("ls", "advantage", cwd=workdir)
    assert out.returncode == 0, out.stderr
    for text in ("gae", "grpo", "rloo", "reinforce_pp", "norm_by_std"):
        assert text in out.stdout
    assert rlx("ls", "nope", cwd=workdir).returncode == 2


def test_short_run_lands_in_mlflow(workdir):
    out = rlx("train", *SHORT, "trainer.output_dir=out", cwd=workdir)
    assert out.returncode == 0, out.stderr
    runs = mlflow_runs(workdir)
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED"
    assert sum(c.startswith("params.") for c in runs.columns) >= 20
    assert run["tags.rlx.algo"] == "grpo" and run["tags.rlx.seed"] == "0" and run["tags.rlx.ablate"] == "none"
    assert "trainer.steps=3" in run["tags.rlx.overrides"]
    for metric in (
        "train/reward",
        "train/loss",
        "train/kl",
        "train/entropy",
        "train/response_len",
        "eval/accuracy",
        "perf/step_s",
        "perf/tokens_per_s",
    ):
        assert f"metrics.{metric}" in runs.columns, metric
    assert (workdir / "out" / "final" / "model.safetensors").is_file()
    final = json.loads((workdir / "out" / "metrics.json").read_text())
    assert final["eval/accuracy"] >= 0
    stages = [final[f"perf/{stage}_s"] for stage in ("generate", "logprobs", "update", "sync")]
    assert min(stages) >= 0 and sum(stages) == pytest.approx(final["perf/step_s"], rel=1e-6)  # the step, split


def test_a_run_that_raises_is_marked_failed(workdir, monkeypatch):
    from rlx_cli.loops import loop
    from rlx_cli.loops.run import train_command

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(loop, "update_step", broken)
    with pytest.raises(RuntimeError, match="injected"):
        train_command([*SHORT, "trainer.output_dir=out"])
    run = mlflow_runs(workdir).iloc[0]
    assert run["status"] == "FAILED" and "injected failure" in run["tags.rlx.error"]
    assert not (workdir / "out" / "final").exists()


@pytest.mark.slow
def test_the_default_learns(workdir):
    """LoRA in 20 steps and full fine-tuning in 40 gain at least 0.15 greedy accuracy on the default: the two runs
    side by side, one thread each (the second core otherwise idle)."""
    cases = {"lora": 20, "full": 40}
    common = ["trainer.eval_every=0", "tracking=none", "trainer.threads=1"]
    commands = [["train", f"model.finetune={f}", f"trainer.steps={s}", *common, f"trainer.output_dir={f}"]
                for f, s in cases.items()]  # fmt: skip
    for finetune, out in zip(cases, rlx_together(*commands, cwd=workdir), strict=True):
        assert out.returncode == 0, out.stderr
        lines = [line for line in out.stderr.splitlines() if line.startswith("step ")]
        start = float(lines[0].split("eval/accuracy ")[1].split()[0])
        final = json.loads((workdir / finetune / "metrics.json").read_text())["eval/accuracy"]
        assert final - start >= 0.15, (finetune, start, final)
