"""Step 6 of a run: tracking. One MLflow run per (config, seed); ``tracking=none`` keeps files only."""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlx_cli.config import locks
from rlx_cli.config.compose import flat
from rlx_cli.config.errors import UserError

DEFAULT_URI = "sqlite:///mlflow.db"
# Metrics go to the store in one batch at most this often: the store's work is mostly per batch and per metric key
# (its latest value), so one batch of ten steps cost 39 ms against 109 ms for ten of one step (50 metrics, SQLite),
# time that a logging thread takes from the training loop (it holds Python's lock).
WRITE_EVERY_S = 2.0


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI)


@contextmanager
def store_lock(uri: str):
    """For a SQLite store, an exclusive lock inside, on a file of the system's temporary directory named by the
    store's path (none beside the user's files): runs started at once on a fresh store would otherwise each create or
    migrate its tables, and all but one fail; other stores: nothing."""
    import hashlib

    if not uri.startswith("sqlite:///"):
        yield
        return
    path = Path(uri.removeprefix("sqlite:///")).resolve()
    name = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    with locks.holding(Path(tempfile.gettempdir()) / f"rlx-store-{name}.lock"):
        yield


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class NullTracker:
    """``tracking=none``: nothing leaves the output directory."""

    run_id = None

    def connect(self) -> None: ...
    def start(self, cfg: DictConfig, tags: dict[str, str], run_id: str | None = None) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def flush(self) -> None: ...
    def log_artifact(self, path: Path) -> None: ...
    def end(self, status: str, error: str | None = None) -> None: ...


class MlflowTracker:
    """Params = the flattened resolved config; tags ``rlx.*``; metrics per step; artifacts at the end."""

    def __init__(self, experiment: str, run_name: str):
        import mlflow

        for noisy in ("alembic", "mlflow"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        self.mlflow = mlflow
        self.experiment, self.run_name = experiment, run_name
        self.run_id: str | None = None
        self.stored: dict[str, set[int]] = {}  # a resumed run's metric steps already in the store
        self.pending: list = []  # metrics logged since the last hand-over to the writer (mlflow.entities.Metric)
        self.handed_over = time.monotonic()
        self.writer: ThreadPoolExecutor | None = None  # one thread that writes the handed-over batches, in order
        self.writing: list[Future] = []  # batches handed over: those not yet written, and any that failed

    def connect(self) -> None:
        """Open the store and the experiment; an unusable URI is the user's error, reported within seconds."""
        self.mlflow.set_tracking_uri(tracking_uri())
        try:
            with fail_fast_http(), store_lock(tracking_uri()):
                self.mlflow.set_experiment(self.experiment)
        except Exception as error:  # noqa: BLE001 - any store failure comes from the user's URI
            raise UserError(
                f"MLFLOW_TRACKING_URI={tracking_uri()} is not usable: {reason(error)} "
                "(valid: a reachable MLflow server, sqlite:///FILE.db or a directory; or tracking=none)"
            ) from error

    def start(self, cfg: DictConfig, tags: dict[str, str], run_id: str | None = None) -> None:
        """A new run; with ``run_id`` (a resumed training) that run again, back to RUNNING, params untouched.

        A resumed run redoes the steps after its checkpoint, and the run that died may have stored some of them:
        those (metric, step) pairs are not logged again (the redo replays the same prompts and random state,
        so its values are the same), and every step is stored once.
        """
        mlflow = self.mlflow
        atexit.register(self.abandon)  # before the run exists: a stop at any moment from here on is covered
        if run_id:
            try:
                mlflow.start_run(run_id=run_id)
            except mlflow.exceptions.MlflowException as error:
                raise UserError(
                    f"the checkpoint's MLflow run {run_id} cannot be continued in experiment '{self.experiment}' "
                    f"at {tracking_uri()}: {reason(error)}"
                ) from error
            self.run_id = run_id
            client = mlflow.MlflowClient()
            if "rlx.error" in client.get_run(run_id).data.tags:  # why it stopped; it goes on now
                client.delete_tag(run_id, "rlx.error")
            self.stored = stored_steps(client, run_id)
            return
        # `rlx sweep` workers: a child of the study's parent run (sets the tag mlflow.parentRunId)
        parent = os.environ.get("RLX_PARENT_RUN_ID") or None
        run = mlflow.start_run(run_name=self.run_name, tags=tags, parent_run_id=parent)
        self.run_id = run.info.run_id
        params = flat(cfg)
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
            mlflow.log_artifact(str(path))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Kept, then handed to the writer thread in one batch every ``WRITE_EVERY_S`` seconds, which writes it off
        the training loop; ``flush`` and ``end`` hand over the rest."""
        from mlflow.entities import Metric

        if self.stored:
            metrics = {k: v for k, v in metrics.items() if step not in self.stored.get(k, ())}
        now = int(time.time() * 1000)
        self.pending += [Metric(key, float(value), now, step) for key, value in metrics.items()]
        if time.monotonic() - self.handed_over >= WRITE_EVERY_S:
            self.hand_over()

    def hand_over(self) -> None:
        """The kept metrics to the writer thread.

        Not MLflow's own asynchronous logging: its thread looks at its queue once a second, and its flush stops and
        restarts that thread, so each flush (a checkpoint, the run's end) and the process's exit waited up to a
        second for nothing (about 2 s of a short run's wall time)."""
        self.writing = [batch for batch in self.writing if not batch.done() or batch.exception()]  # a failed one stays
        if self.pending:
            self.writer = self.writer or ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlx-metrics")
            self.writing.append(self.writer.submit(self.write, self.pending))
        self.pending, self.handed_over = [], time.monotonic()

    def write(self, metrics: list) -> None:
        """Into the store now, in batches of at most MLflow's 1,000."""
        client = self.mlflow.MlflowClient()
        for start in range(0, len(metrics), 1000):
            client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def flush(self) -> None:
        """Block until every metric logged so far is in the store (before a checkpoint: a resume relies on it); a
        write that failed raises here."""
        self.hand_over()
        writing, self.writing = self.writing, []
        for batch in writing:
            batch.result()

    def log_artifact(self, path: Path) -> None:
        self.mlflow.log_artifact(str(path))

    def end(self, status: str, error: str | None = None) -> None:
        self.flush()  # every queued metric is in the store before the run is closed
        if self.writer:
            self.writer.shutdown()
            self.writer = None
        if error:
            self.mlflow.set_tag("rlx.error", error[:5000])
        self.mlflow.end_run(status=status)

    def abandon(self) -> None:
        """At exit, a run this process left open (a second signal cut ``end`` short, a stop came while the run
        started) ends KILLED: MLflow's own exit hook, which runs after this one, would end it FINISHED, and a
        study would then take a half-done run for a finished one."""
        if self.mlflow.active_run() is not None:
            for batch in self.writing:  # the metrics of the steps it did; the writer thread has stopped by now
                batch.exception()
            self.write(self.pending)
            self.mlflow.end_run(status="KILLED")


def stored_steps(client, run_id: str) -> dict[str, set[int]]:
    """metric -> the steps the run already holds."""
    return {
        key: {m.step for m in client.get_metric_history(run_id, key)} for key in client.get_run(run_id).data.metrics
    }


@contextmanager
def fail_fast_http():
    """No retries and a short time-out while connecting: MLflow's defaults wait minutes for a dead server."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def reason(error: Exception) -> str:
    """An exception's gist in one short line ('[Errno 111] Connection refused' from a wall of HTTP text)."""
    text = str(error)
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    first = errno.group(0) if errno else (text.splitlines()[0] if text else type(error).__name__)
    return first[:200]


def ui_command(host: str, port: int) -> int:
    """``mlflow ui`` on the current store, bound to ``host`` (loopback unless asked); -> its exit code."""
    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):
        raise UserError(f"MLFLOW_TRACKING_URI={uri} is a tracking server already: open it in a browser")
    if not 1 <= port <= 65535:
        raise UserError(f"--port {port} is out of range (valid: 1 to 65535)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"rlx ui: --host {host} lets other machines read your runs", file=sys.stderr)
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    print(f"rlx ui: http://{host}:{port}  (store {uri}; Ctrl-C stops it)", file=sys.stderr)
    try:
        return subprocess.call(argv)
    except KeyboardInterrupt:
        return 130


def make_tracker(cfg: DictConfig, run_name: str):
    """The run's tracker; under torchrun only rank 0's is MLflow, the other processes log nothing."""
    from rlx_cli.engine import distributed

    if cfg.tracking.name == "none" or not distributed.is_main():
        return NullTracker()
    return MlflowTracker(cfg.tracking.experiment, cfg.tracking.run_name or run_name)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
