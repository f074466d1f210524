"""The benchmark scripts start: their plans print without running anything heavy."""

from __future__ import annotations

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
