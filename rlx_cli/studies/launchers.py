"""Where sweep points run: local worker processes, submitit (Slurm or its local executor), or Ray.

Every launcher runs the same thing per point: ``python -m rlx_cli train OVERRIDES`` in a subprocess with
its own environment, stdout and stderr in a log file; a launcher only decides where that subprocess lives.
The sweep calls ``launcher.call(job)`` from up to ``--jobs`` threads at once, so ``call`` blocks.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rlx_cli.config import locks
from rlx_cli.config.errors import UserError

LAUNCHERS = ("local", "submitit", "ray")


@dataclass(frozen=True)
class Job:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str  # absolute path of the worker's log
    lock: str | None = None  # absolute path of the point's worker lock (``study.WORKER_LOCK``)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None  # looked up here, not in a fork


def stop_with_parent() -> None:
    """In the worker, before it runs: SIGTERM when the process that started it dies, even by SIGKILL (Linux), so it
    checkpoints and ends its run KILLED, and the next launch resumes it; elsewhere it runs on to its end."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def run_worker(
    argv: list[str], env: dict[str, str], cwd: str, log: str, running: set | None = None, *, lock: str | None = None
) -> int:
    """One point: the training subprocess, its output appended to ``log``; returns its exit code.

    ``lock``: the point's worker lock, taken here and handed down to the subprocess, which holds it until it exits.
    """
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    held = locks.take(Path(lock), wait=5.0) if lock else None
    if lock and held is None:
        raise RuntimeError(f"another process holds {lock}: this point is running elsewhere")
    try:
        with open(log, "a") as out:
            out.write(f"--- {datetime.now():%Y-%m-%d %H:%M:%S}: rlx {' '.join(argv[3:])}\n")
            out.flush()
            process = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=() if held is None else (held,), preexec_fn=stop_with_parent,
            )  # fmt: skip
    finally:
        if held is not None:
            os.close(held)  # the subprocess holds the lock now
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

    def __init__(self, jobs: int, folder: Path):
        self.jobs, self.running = jobs, set()

    def describe(self) -> str:
        return f"{self.jobs} local worker{'s' if self.jobs > 1 else ''}"

    def call(self, job: Job) -> int:
        return run_worker(job.argv, job.env, job.cwd, job.log, self.running, lock=job.lock)

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

    def __init__(self, jobs: int, folder: Path):
        submitit = require("submitit", "submitit")
        self.jobs = jobs
        self.executor = submitit.AutoExecutor(
            folder=str(folder.resolve() / "submitit"), cluster=os.environ.get("RLX_SUBMITIT_CLUSTER") or None
        )
        self.executor.update_parameters(timeout_min=int(os.environ.get("RLX_SUBMITIT_TIMEOUT_MIN", 24 * 60)))
        self.lock = threading.Lock()  # submitting from several threads at once is not documented as safe

    def describe(self) -> str:
        return f"submitit ({self.executor.cluster}), {self.jobs} at a time"

    def call(self, job: Job) -> int:
        with self.lock:
            handle = self.executor.submit(run_worker, job.argv, job.env, job.cwd, job.log, lock=job.lock)
        return handle.result()

    def interrupt(self) -> None: ...  # submitit's local jobs get the terminal's SIGINT; Slurm jobs keep running

    def close(self) -> None: ...


class RayLauncher:
    """Ray tasks: the cluster at ``RAY_ADDRESS`` if set, else a local one started here (and stopped after)."""

    def __init__(self, jobs: int, folder: Path):
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
        return self.ray.get(self.remote.remote(job.argv, job.env, job.cwd, job.log, lock=job.lock))

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


def make_launcher(name: str, jobs: int, folder: Path):
    check_launcher(name)
    return {"local": LocalLauncher, "submitit": SubmititLauncher, "ray": RayLauncher}[name](jobs, folder)
