"""Shared bits of the benchmarks: load, versions, medians, peak RSS, tables and JSON."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def one_thread(threads: int = 1) -> None:
    """Both tools get one thread (or ``threads`` each): the machine is shared, and the comparison must not hinge on
    who grabs more cores."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def load() -> dict[str, float]:
    """1/5/15-minute load averages and the core count: every figure is read against them."""
    one, five, fifteen = os.getloadavg()
    return {"load1": round(one, 2), "load5": round(five, 2), "load15": round(fifteen, 2), "cores": os.cpu_count()}


def versions(*names: str) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timers:
    """Seconds spent in named phases inside each step, keyed by step start; filled by patched functions."""

    def __init__(self, phases=("generate", "logp")):
        self.names = phases
        self.step_starts: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.active = False

    def start_step(self) -> None:
        self.step_starts.append(time.perf_counter())
        self.phases.append(dict.fromkeys(self.names, 0.0))
        self.active = True

    def wrap(self, fn, phase, when=lambda: True):
        def timed(*args, **kwargs):
            if not (self.active and when()):
                return fn(*args, **kwargs)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.phases[-1][phase] += time.perf_counter() - t

        return timed

    def summary(self, warmup: int, compute: tuple[str, ...] | None = None) -> dict:
        """Medians over steps after ``warmup``; the last step start closes the last measured step.

        ``rest`` is the step minus the ``compute`` phases (default: all of them)."""
        compute = self.names if compute is None else compute
        steps = [b - a for a, b in zip(self.step_starts, self.step_starts[1:])][warmup:]
        phases = self.phases[warmup : len(self.step_starts) - 1]
        out = {"steps_measured": len(steps), "step_s": median(steps), "step_s_all": steps}
        for name in self.names:
            out[f"{name}_s"] = median([p[name] for p in phases])
        rest = [s - sum(p[c] for c in compute) for s, p in zip(steps, phases)]
        out["rest_s"] = median(rest)
        out["rest_share"] = median([r / s for r, s in zip(rest, steps)])
        return out


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_worker(argv: list[str], out: Path, env: dict[str, str] | None = None, timeout: float = 1800) -> dict:
    """Run ``argv`` (which writes JSON to ``out``), with one thread; -> the JSON plus wall time and peak RSS."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    before = load()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(log[-4000:])
        raise SystemExit(f"worker failed ({proc.returncode}): {' '.join(argv)}")
    data = json.loads(out.read_text())
    data.update(wall_s=wall, load_before=before, load_after=load())
    return data


def table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-markdown table, numbers as given (format them first)."""
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(name: str, data: dict, path: str | None = None) -> Path:
    target = Path(path) if path else RESULTS / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return target


def rlx_home() -> Path:
    return Path(os.environ.get("RLX_HOME", Path.home() / ".cache" / "rlx"))


def write_user_rows(path: Path, n: int = 400) -> Path:
    """A user's prompt file (``task=jsonl``): ``n`` rows {prompt: 'a+b=', answer: str(a + b)}, a and b in 1..50 drawn
    by ``random.Random(0)``, for the ``exact`` verifier (the issue-53 task of docs/benchmarks.md)."""
    import random

    rng = random.Random(0)
    pairs = [(rng.randint(1, 50), rng.randint(1, 50)) for _ in range(n)]
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in pairs))
    return path
