"""benchmarks/gpu/speed.py, the GPU session's prepared script, at a tiny shape on the CPU: each part a process of its
own writing its JSON (the device and versions named) with every figure it measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu" / "speed.py"
TINY = ["--device", "cpu", "--shape", "tiny", "--rows", "8", "--prompt-len", "8"]


def speed(tmp_path, *args: str) -> dict[str, dict]:
    """speed.py run with ``args`` -> each part's JSON by part."""
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), *TINY, *args, "--out", str(out), "--work", str(tmp_path / "work")]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {path.stem.removeprefix("speed_"): json.loads(path.read_text()) for path in out.glob("speed_*.json")}


def test_decode_and_update_parts_on_the_cpu(tmp_path):
    parts = speed(tmp_path, "--decode-tokens", "8", "--check-tokens", "6", "--micro-batch-tokens", "96",
                  "--update-tokens", "16", "--modes", "before", "own")  # fmt: skip
    assert parts.keys() == {"decode", "update"}
    for part in parts.values():
        assert part["device"] == "cpu" and part["torch"] and part["transformers"] and part["peft"]
    decode, update = parts["decode"], parts["update"]
    assert decode["eager"]["ms_per_token"] > 0 and decode["graphs"]["ms_per_token"] > 0 and decode["speedup"] > 0
    assert decode["greedy_rows_equal"] == 1.0  # float32, static form uncaptured: the eager loop's tokens
    assert update["micro_batch"]["rows"] == 4 and update["micro_batch"]["tokens"] == 4 * 23
    assert update["before"]["own_forward"] is False and update["own"]["own_forward"] is True
    assert update["before"]["s"] > 0 and update["own"]["tokens_per_s"] > 0 and "own_compiled" not in update


@pytest.mark.slow
def test_the_step_part_runs_rlx_train_and_says_what_ran(tmp_path):
    """The step part's rlx train run (its last update profiled) at a tiny shape: each step's figures, and what was in
    effect: rlx's own forward under activation checkpointing, the sampler's graphs (off on the CPU)."""
    parts = speed(tmp_path, "--parts", "step", "--prompts", "2", "--new-tokens", "4", "--micro-batch-tokens", "256")
    run = parts["step"]["1.5b-grpo-full-fast"]
    assert "cut" not in run and "failed" not in run, run.get("log_tail")
    assert run["steps"] == 3 and run["perf/update_s"] > 0 and run["profile"].startswith("update of step 3")
    assert run["in_effect"]["own_forward"] is True and run["in_effect"]["cuda_graphs"] is False
    assert "compiled" in run["in_effect"]  # trainer.compile=true, once the build passes it on


@pytest.mark.slow
def test_the_overlap_part_runs_the_same_run_with_and_without_the_sampler_process(tmp_path):
    """The overlap part at a tiny shape on the CPU: both runs finish, each step's train/rollout_kl side by side, the
    overlapped run logs the trainer's wait apart from the sampler's time."""
    parts = speed(
        tmp_path, "--parts", "overlap", "--prompts", "2", "--overlap-tokens", "4", "--micro-batch-tokens", "256"
    )
    part = parts["overlap"]
    for name in ("0.5b-grpo-full-lag1", "0.5b-grpo-full-overlap"):
        assert "cut" not in part[name] and "failed" not in part[name], part[name].get("log_tail")
        assert part[name]["steps"] == 4 and part[name]["perf/generate_s"] > 0
    assert (
        "perf/sample_wait_s" in part["0.5b-grpo-full-overlap"]
        and "perf/sample_wait_s" not in part["0.5b-grpo-full-lag1"]
    )
    assert len(part["rollout_kl_by_step"]) == 4
    assert all(abs(s["sequential"] - s["overlap"]) <= 1e-6 for s in part["rollout_kl_by_step"])  # one run, twice
