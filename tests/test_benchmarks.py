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
