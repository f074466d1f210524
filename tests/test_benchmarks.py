"""The benchmark scripts start: their plans print without running anything heavy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("vs_trl.py", "tiny lora: 8 new tokens"),
        ("memory.py", "train algo=vapo model.finetune=lora"),
        ("gpu/generate_mfu.py", '"params": 494005120'),
    ],
)
def test_benchmark_dry_run(script, expected):
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout


@pytest.mark.slow
def test_gpu_train_bench_smoke_on_the_cpu(tmp_path):
    """benchmarks/gpu/rlx_train.py at a tiny shape on the CPU: each run's step figures from its worker, the profiled
    run one step longer with its update's operator table, and the step before it reported."""
    import json

    out = tmp_path / "gpu.json"
    command = [sys.executable, str(REPO / "benchmarks" / "gpu" / "rlx_train.py"), "--device", "cpu", "--shape", "tiny",
               "--new-tokens", "8", "--prompts", "4", "--runs", "1.5b-grpo-full", "7b-grpo-lora",
               "--work", str(tmp_path / "work"), "--json", str(out)]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    profiled, plain = runs["1.5b-grpo-full"], runs["7b-grpo-lora"]
    assert profiled["steps"] == 3 and profiled["reported_step"] == 2 and len(profiled["step_s_each"]) == 3
    assert profiled["profile"].startswith("update of step 3 under the profiler") and "aten::" in profiled["profile"]
    assert plain["steps"] == plain["reported_step"] == 1 and "profile" not in plain
    assert "eval.max_new_tokens=1" in plain["command"] and plain["perf/update_s"] > 0
    assert 0 < plain["train/response_len"] <= 8.0  # --new-tokens


def test_vs_trl_user_task(tmp_path, monkeypatch):
    """``vs_trl.py --task user``: the plan (the user's model, rlx's own sampler, answers ending at EOS, overlap's
    overrides passed on), rlx's overrides as a user writes them, and TRL's side: the same file's prompts and an exact
    match of the stripped completion, which rlx's ``exact`` verifier agrees with."""
    import argparse

    command = [sys.executable, str(REPO / "benchmarks" / "vs_trl.py"), "--task", "user", "--finetunes", "full",
               "--rlx-set", "rollout.lag=1", "rollout.overlap=true", "--dry-run"]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("user full: 8 new tokens (natural), task user, rlx rollout=fast rollout.lag=1 ")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from _common import write_user_rows
    from vs_trl_workers import task_overrides, trl_task

    args = argparse.Namespace(task="user", rows=str(write_user_rows(tmp_path / "rows.jsonl")))
    assert task_overrides(args) == ["model=hf", "task=jsonl", f"task.path={args.rows}"]
    task, reward = trl_task(args)
    problems = task.train_problems(16, seed=0, step=1)
    assert len(task.train) == 360 and len(problems) == 16 and problems[0].prompt.endswith("=")
    answer = problems[0].answer
    completions = [f" {answer}\n", f"{answer}0", ""]
    assert reward(None, completions, [answer] * 3) == [1.0, 0.0, 0.0]
    assert task.score_batch(completions, [problems[0]] * 3) == [1.0, 0.0, 0.0]
