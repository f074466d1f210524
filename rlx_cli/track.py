"""Step 6 of a run: tracking. One MLflow run per (config, seed); ``tracking=none`` keeps files only."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlx_cli.errors import UserError

DEFAULT_URI = "sqlite:///mlflow.db"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole values."""
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


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
    def start(self, cfg: DictConfig, tags: dict[str, str]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
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

    def connect(self) -> None:
        """Open the store and the experiment; an unusable URI is the user's error."""
        self.mlflow.set_tracking_uri(tracking_uri())
        try:
            self.mlflow.set_experiment(self.experiment)
        except Exception as error:  # noqa: BLE001 - any store failure comes from the user's URI
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UserError(f"MLFLOW_TRACKING_URI={tracking_uri()} is not usable: {first}") from error

    def start(self, cfg: DictConfig, tags: dict[str, str]) -> None:
        mlflow = self.mlflow
        run = mlflow.start_run(run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id
        params = flatten(OmegaConf.to_container(cfg, resolve=True))
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
            mlflow.log_artifact(str(path))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def log_artifact(self, path: Path) -> None:
        self.mlflow.log_artifact(str(path))

    def end(self, status: str, error: str | None = None) -> None:
        if error:
            self.mlflow.set_tag("rlx.error", error[:5000])
        self.mlflow.end_run(status=status)


def make_tracker(cfg: DictConfig, run_name: str):
    if cfg.tracking.name == "none":
        return NullTracker()
    return MlflowTracker(cfg.tracking.experiment, cfg.tracking.run_name or run_name)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
