"""Where sweep points run: local worker processes, submitit (Slurm or its local executor), or Ray.

Every launcher runs the same thing per point: ``python -m rlx_cli train OVERRIDES`` in a subprocess with
its own environment, stdout and stderr in a log file; a launcher only decides where that subprocess lives.
The sweep calls ``launcher.call(job)`` from up to ``--jobs`` threads at once, so ``call`` blocks.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from rlx_cli.errors import UserError

LAUNCHERS = ("local", "submitit", "ray")


@dataclass(frozen=True)
class Job:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str  # absolute path of the worker's log


def run_worker(argv: list[str], env: dict[str, str], cwd: str, log: str, running: set | None = None) -> int:
    """One point: the training subprocess, its output in ``log``; returns its exit code."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        if running is not None:
            running.add(process)
        try:
            return process.wait()
        finally:
            if running is not None:
                running.discard(process)


def require(package: str, launcher: str):
    try:
        return importlib.import_module(package)
    except ImportError:
        raise UserError(
            f"--launcher {launcher} needs the '{package}' package: install rlx[cluster] (pip install 'rlx[cluster]')"
        ) from None


class LocalLauncher:
    """Worker processes on this machine."""

    def __init__(self, jobs: int, sweep_dir: Path):
        self.jobs, self.running = jobs, set()

    def describe(self) -> str:
        return f"{self.jobs} local worker{'s' if self.jobs > 1 else ''}"

    def call(self, job: Job) -> int:
        return run_worker(job.argv, job.env, job.cwd, job.log, self.running)

    def interrupt(self) -> None:
        """Ctrl-C: the workers mark their runs KILLED (a terminal sends them SIGINT too; a plain kill does not)."""
        for process in list(self.running):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)

    def close(self) -> None: ...


class SubmititLauncher:
    """submitit's AutoExecutor: Slurm where ``sbatch`` exists, else its local executor.

    ``RLX_SUBMITIT_CLUSTER`` (slurm | local | debug) forces one; ``RLX_SUBMITIT_TIMEOUT_MIN`` sets the time limit.
    """

    def __init__(self, jobs: int, sweep_dir: Path):
        submitit = require("submitit", "submitit")
        self.jobs = jobs
        self.executor = submitit.AutoExecutor(
            folder=str(sweep_dir.resolve() / "submitit"), cluster=os.environ.get("RLX_SUBMITIT_CLUSTER") or None
        )
        self.executor.update_parameters(timeout_min=int(os.environ.get("RLX_SUBMITIT_TIMEOUT_MIN", 24 * 60)))
        self.lock = threading.Lock()  # submitting from several threads at once is not documented as safe

    def describe(self) -> str:
        return f"submitit ({self.executor.cluster}), {self.jobs} at a time"

    def call(self, job: Job) -> int:
        with self.lock:
            handle = self.executor.submit(run_worker, job.argv, job.env, job.cwd, job.log)
        return handle.result()

    def interrupt(self) -> None: ...  # submitit's local jobs get the terminal's SIGINT; Slurm jobs keep running

    def close(self) -> None: ...


class RayLauncher:
    """Ray tasks: the cluster at ``RAY_ADDRESS`` if set, else a local one started here (and stopped after)."""

    def __init__(self, jobs: int, sweep_dir: Path):
        self.ray = require("ray", "ray")
        self.jobs, self.started = jobs, False
        if not self.ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS") or None
            local = {} if address else {"num_cpus": max(jobs, os.cpu_count() or 1)}
            self.ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
            self.started = True
        self.remote = self.ray.remote(num_cpus=1)(run_worker)

    def describe(self) -> str:
        return f"ray, {self.jobs} at a time"

    def call(self, job: Job) -> int:
        return self.ray.get(self.remote.remote(job.argv, job.env, job.cwd, job.log))

    def interrupt(self) -> None: ...  # close() stops a local cluster and its tasks

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def check_launcher(name: str) -> None:
    """Fail fast, before anything is written: an unknown launcher or a missing package."""
    if name not in LAUNCHERS:
        raise UserError(f"unknown launcher '{name}' (valid: {', '.join(LAUNCHERS)})")
    if name != "local":
        require(name, name)


def make_launcher(name: str, jobs: int, sweep_dir: Path):
    check_launcher(name)
    return {"local": LocalLauncher, "submitit": SubmititLauncher, "ray": RayLauncher}[name](jobs, sweep_dir)
