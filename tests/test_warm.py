"""The suite's warm start (``warm.py``) gives what the ``rlx`` process a shell starts gives: the same exit code,
stdout and stderr for help, a listing and a refusal; a variable read at run time reaches it; a variable read at
start-up sends the command to a fresh process instead."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from warm import WARM


def fresh(args: list[str], cwd, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rlx_cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [["--help"], ["ls", "advantage"], ["train", "algo=nope"]], ids=" ".join)
def test_a_warm_start_gives_what_a_fresh_process_gives(workdir, args):
    started = WARM.start(args, workdir, dict(os.environ))
    assert started is not None, "the warm interpreter is not ready: its imports printed something or left a thread"
    out, err = started.communicate(timeout=300)
    expected = fresh(args, workdir, dict(os.environ))
    assert (started.returncode, out, err) == (expected.returncode, expected.stdout, expected.stderr)
    assert out or err


def test_a_variable_read_at_run_time_reaches_the_warm_process(workdir):
    env = {**os.environ, "RLX_DEBUG": "1"}  # a traceback instead of the one line
    started = WARM.start(["train", "algo=nope"], workdir, env)
    _, err = started.communicate(timeout=300)
    expected = fresh(["train", "algo=nope"], workdir, env)
    assert started.returncode == expected.returncode != 0 and "Traceback" in err and "Traceback" in expected.stderr
    assert err.splitlines()[-1] == expected.stderr.splitlines()[-1]
    assert "Traceback" not in WARM.start(["train", "algo=nope"], workdir, dict(os.environ)).communicate(300)[1]


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "PYTHONPATH", "PYTHONHASHSEED"])
def test_a_variable_read_at_start_up_gets_a_fresh_process(workdir, name):
    assert WARM.start(["ls", "advantage"], workdir, {**os.environ, name: "1"}) is None
