"""``rlx ARGS`` in a process forked from a warm interpreter: the fresh process a user's ``python -m rlx_cli``
starts (its own pid, cwd, environment, stdout and stderr; ``python -m``'s own ``runpy`` entry; the interpreter's
normal exit: threads joined, ``atexit`` run), without importing torch, transformers, MLflow and the rest again (most
of a short run's CPU time). Two warm interpreters take turns, each with its own string-hash seed, so twin runs that a
test compares do not share one; each forked process seeds NumPy's global generator from the OS, as a fresh one does
(Python's ``random`` reseeds itself at a fork). A command starts the ordinary way instead when its environment
differs from the warm one's in a variable read before ``main`` runs (``OMP_NUM_THREADS``, ``PYTHONPATH``,
``PYTHONHASHSEED``...), or when the warm interpreter's imports printed anything (a real start-up would show it; a
fork would not) or left a Python thread running."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# read when a command runs, never at import: a warm interpreter may serve a command that sets them differently
READ_AT_RUN_TIME = {
    "MLFLOW_TRACKING_URI",
    "PYTEST_CURRENT_TEST",
    "RLX_DEBUG",
    "RLX_HOME",
    "RLX_INJECT_NAN",
    "RLX_SUBMITIT_CLUSTER",
}
SERVE = r"""
import json, os, sys, threading, warnings
with warnings.catch_warnings(record=True) as shown:
    warnings.simplefilter("default")
    for ignored in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", ignored)
    import mlflow, torch, transformers, rlx_cli.cli, rlx_cli.loops.run, rlx_cli.loops.build  # what every run imports
    import mlflow.store.tracking.sqlalchemy_store, transformers.models.llama.modeling_llama, peft, scipy.optimize
requests, replies = os.fdopen(os.dup(0), "r"), os.dup(1)
quiet = os.open(os.devnull, os.O_RDWR)
os.dup2(quiet, 0), os.dup2(quiet, 1)
threads = threading.active_count()  # Python's; the native pools of OpenBLAS and jemalloc stop and restart at a fork
printed = os.fstat(2).st_size
os.write(replies, (json.dumps({"ready": not shown and threads == 1 and printed == 0}) + "\n").encode())
import gc
gc.freeze()  # the imports' objects: no collection in a forked process writes to (and so copies) their pages


def serve() -> dict:
    for line in requests:
        asked = json.loads(line)
        if asked["op"] == "start":
            if (pid := os.fork()) == 0:
                return asked
            answer = {"pid": pid}
        else:
            pid, status = os.waitpid(asked["pid"], os.WNOHANG if asked["op"] == "poll" else 0)
            answer = {"returncode": os.waitstatus_to_exitcode(status) if pid else None}
        os.write(replies, (json.dumps(answer) + "\n").encode())
    os._exit(0)


asked = serve()
requests.close(), os.close(replies), os.close(quiet)
if asked["session"]:
    os.setsid()
os.chdir(asked["cwd"])
os.environ.clear()
os.environ.update(asked["env"])
for fd, name in ((1, "stdout"), (2, "stderr")):
    os.dup2(os.open(asked[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
sys.path[0] = os.getcwd()  # as python -m puts it
import numpy
numpy.random.seed()  # from the OS, as a fresh process seeds it (Python's random reseeds itself at a fork)
sys.argv = ["-m", *asked["args"]]
del gc, json, os, sys, numpy, warnings, threading, shown, requests, replies, quiet, threads, printed, serve, asked
import runpy
runpy._run_module_as_main("rlx_cli")
"""


class Interpreter:
    """One warm interpreter: it forks a command's process on request and reports its exit."""

    def __init__(self, env: dict) -> None:
        self.env, self.log = env, tempfile.NamedTemporaryFile(prefix="rlx-warm-", suffix=".err")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, cwd=tempfile.gettempdir(), text=True)  # fmt: skip
        self.ready = self.reply()["ready"]

    def ask(self, timeout: float | None = None, **request) -> dict:
        """The interpreter's answer to ``request``; TimeoutError after ``timeout`` s (the request stays asked)."""
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.reply(timeout)

    def reply(self, timeout: float | None = None) -> dict:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm interpreter died: {Path(self.log.name).read_text()[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Started:
    """A command's process started by an :class:`Interpreter`, used as ``subprocess.Popen`` is (text output)."""

    def __init__(self, by: Interpreter, args: list[str], cwd: Path, env: dict, session: bool) -> None:
        self.by, self.args, self.returncode = by, ["rlx", *args], None
        self.folder = Path(tempfile.mkdtemp(prefix="rlx-run-"))
        streams = {name: str(self.folder / name) for name in ("stdout", "stderr")}
        self.pid = by.ask(op="start", args=args, cwd=str(cwd), env=env, session=session, **streams)["pid"]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.by.ask(op="poll", pid=self.pid)["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self.by.ask(timeout, op="wait", pid=self.pid)["returncode"]
            except TimeoutError:
                self.kill()
                self.returncode = self.by.reply()["returncode"]
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """stdout and stderr as ``subprocess`` decodes them (UTF-8, universal newlines), once it exited."""
        self.wait(timeout)
        streams = tuple((self.folder / name).read_text() for name in ("stdout", "stderr"))
        shutil.rmtree(self.folder)
        return streams

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(9)


class Warm:
    """This process's two warm interpreters, started at first use; they take turns."""

    def __init__(self) -> None:
        self.interpreters: list[Interpreter] = []
        self.turn = 0

    def start(self, args: list[str], cwd: Path, env: dict, session: bool = False) -> Started | None:
        """``args``' process forked from a warm interpreter (in a session of its own if ``session``: a process group
        whose id is its pid, as ``start_new_session`` gives), or None where it must start the ordinary way."""
        if not self.interpreters:
            base = {k: v for k, v in os.environ.items() if k not in READ_AT_RUN_TIME}
            self.interpreters = [Interpreter(base) for _ in range(2)]
            atexit.register(lambda: [i.close() for i in self.interpreters])
        by = self.interpreters[self.turn % 2]
        differ = {k for k in env.keys() | by.env.keys() if env.get(k) != by.env.get(k)}
        if not by.ready or differ - READ_AT_RUN_TIME:
            return None
        self.turn += 1
        return Started(by, [str(a) for a in args], cwd, env, session)


WARM = Warm()
