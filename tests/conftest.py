"""Shared fixtures: an isolated MLflow store per test, the CLI in a subprocess, composed configs."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warm import WARM, Started

os.environ["HF_HUB_OFFLINE"] = "1"
REPO = Path(__file__).resolve().parents[1]
# a few steps on the built-in default, quiet and fast (the base model is cached in $RLX_HOME)
SHORT = [
    "trainer.steps=3",
    "trainer.eval_every=0",
    "rollout.prompts_per_step=4",
    "task.eval_size=20",
    "trainer.threads=1",
]


def read_each_config_file_once() -> None:
    """Hydra reads and parses every config file again at each compose (a ``CachingConfigRepository`` per call); the
    suite's pytest processes compose about a thousand configs from files no test rewrites, so here each file is read
    once a process and handed out as a deep copy (a compose may change what it gets). Hydra's private API: where it
    changed, composes read the files as before."""
    from hydra._internal import config_repository

    repository = getattr(config_repository, "ConfigRepository", None)
    if repository is None or not hasattr(repository, "load_config"):
        return
    load, loaded = repository.load_config, {}

    def load_once(self, config_path: str):
        key = (tuple(source.path for source in self.sources), config_path)
        if key not in loaded:
            loaded[key] = load(self, config_path)
        return copy.deepcopy(loaded[key])

    repository.load_config = load_once


read_each_config_file_once()


@pytest.fixture(autouse=True)
def environment_kept():
    """Each test leaves ``os.environ`` as it found it: what its in-process runs set there (MLflow's
    ``set_experiment`` sets ``MLFLOW_EXPERIMENT_ID``) does not reach a later test's ``rlx`` processes."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory with its own MLflow store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


def rlx(*args: str, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``rlx ARGS`` as a user runs it, in ``cwd``, a process of its own (forked from a warm interpreter where it
    can be: ``warm.py``); never raises on a non-zero exit."""
    return rlx_together(list(args), cwd=cwd, env=[env or {}], timeout=timeout)[0]


def rlx_here(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``rlx ARGS`` in this process, with the exit code, stdout and stderr a process would give (a traceback on
    stderr where it would print one, and the warnings it would show): no interpreter and imports to start. Only for
    commands that end before loading torch in a process of their own (their state would stay in this one)."""
    import traceback
    import warnings

    from typer.testing import CliRunner

    from rlx_cli.cli import app

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # Python's own filters, as a process starts with
        warnings.simplefilter("default")
        for ignored in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", ignored)  # ahead of "default"
        patch.chdir(cwd)
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        result = CliRunner().invoke(app, list(args))
    shown = [warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught]
    stderr = result.stderr + "".join(shown)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["rlx", *args], result.exit_code, result.stdout, stderr)


ONE_PROCESS = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import mlflow, torch, transformers, rlx_cli.cli, rlx_cli.loops.run, rlx_cli.loops.build  # once, before the cases
from conftest import rlx_here
cases, done = json.loads(Path(sys.argv[2]).read_text()), {}
for case, (args, cwd, env) in cases.items():
    out = rlx_here(*args, cwd=Path(cwd), env=env)
    done[case] = [out.returncode, out.stdout, out.stderr]
Path(sys.argv[3]).write_text(json.dumps(done))
"""


def rlx_in_one_process(cases: dict, folder: Path, env: dict | None = None) -> dict[str, subprocess.CompletedProcess]:
    """Each of ``cases`` (name -> (ARGS, cwd, env)) as ``rlx_here`` would run it, one after the other in one fresh
    Python process (its environment ``env``, default this one's): what each sets up there (torch's threads, the
    allocator) stays out of this one, and torch, transformers and MLflow are imported once for all; their results
    by name (``folder`` holds the hand-over)."""
    (folder / "cases.json").write_text(json.dumps({k: (a, str(c), e or {}) for k, (a, c, e) in cases.items()}))
    command = [sys.executable, "-c", ONE_PROCESS, str(Path(__file__).parent), str(folder / "cases.json")]
    ran = subprocess.run([*command, str(folder / "done.json")], capture_output=True, text=True, timeout=600, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    done = json.loads((folder / "done.json").read_text())
    return {k: subprocess.CompletedProcess(["rlx", *cases[k][0]], *done[k]) for k in cases}


def rlx_together(
    *commands: list[str], cwd: Path | list[Path], env: list[dict] | None = None, timeout: float = 600
) -> list[subprocess.CompletedProcess]:
    """Each of ``commands`` as ``rlx ARGS``, all at once (independent runs: on two cores with one thread each they
    take the time of one), in ``cwd`` (one folder, or one for each) with ``env``'s variables for each added; their
    results in order; never raises on a non-zero exit."""
    cwds = cwd if isinstance(cwd, list) else [cwd] * len(commands)
    procs = [
        rlx_start(*args, cwd=folder, env=more)
        for args, folder, more in zip(commands, cwds, env or [{}] * len(commands), strict=True)
    ]
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def rlx_start(*args: str, cwd: Path, env: dict | None = None, **popen) -> subprocess.Popen | Started:
    """``rlx ARGS`` started in ``cwd`` with ``env``'s variables added, as ``subprocess.Popen`` would start it (text
    output, captured unless ``popen`` says otherwise): forked from a warm interpreter where it can be (``warm.py``:
    then its output is captured either way)."""
    environ = {**os.environ, **(env or {})}
    if started := WARM.start(list(args), cwd, environ, session=popen.get("start_new_session", False)):
        return started
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) | popen
    return subprocess.Popen([sys.executable, "-m", "rlx_cli", *args], cwd=cwd, env=environ, **pipes)


def save_tiny_llama(path: Path, *, layers: int, heads: int, head_dim: int, tie: bool = False) -> Path:
    """A random tiny Llama (hidden 32) with the character tokenizer, saved at ``path`` like a user's checkpoint."""
    import torch
    from transformers import LlamaForCausalLM

    from rlx_cli.engine.base_model import char_llama_config, char_tokenizer

    arch = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
    )
    config = char_llama_config(arch, tie=tie, max_positions=64)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def undocumented_metrics(names) -> list[str]:
    """The metric ``names`` that docs/metrics.md does not define: its tables (``eval/pass_at_<k>`` stands for every
    k), and its critic fits, whose section names each metric under one prefix and the same under the others."""
    import re

    text = (REPO / "docs" / "metrics.md").read_text()
    table = set(re.findall(r"^\| `([^`]+)` \| .+ \|$", text, flags=re.M))
    heading, fits = text.split("\n## Critic fits", 1)[1].split("\n## ", 1)[0].split("\n", 1)
    prefixes = re.findall(r"`([a-z_]+)/`", heading)  # (`value_pretrain/`, `reward_fit/`)
    fitted = {f"{prefix}/{name}" for prefix in prefixes for name in re.findall(r"`[a-z_]+/([a-z_]+)`", fits)}
    return [n for n in names if re.sub(r"pass_at_\d+", "pass_at_<k>", n) not in table | fitted]


def mlflow_runs(workdir: Path, experiment: str = "rlx"):
    """All runs of ``experiment`` in the test's store as a DataFrame (empty if there is none)."""
    import mlflow
    import pandas as pd

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    if mlflow.get_experiment_by_name(experiment) is None:
        return pd.DataFrame()
    return mlflow.search_runs(experiment_names=[experiment])


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of a markdown table (after its header and rule), cells stripped."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
