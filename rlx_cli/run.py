"""One ``rlx train``: compose → validate → build → loop → track, with a FAILED/KILLED run on errors."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlx_cli.compose import ablations, choices_of, compose, job_config
from rlx_cli.progress import Progress
from rlx_cli.track import git_sha, make_tracker, tracking_uri, write_json
from rlx_cli.validate import validate


def run_name(cfg: DictConfig) -> str:
    choices = choices_of(cfg)
    ablate = ablations(choices)
    return f"{choices['algo']}{''.join('+' + a for a in ablate)}-s{cfg.seed}"


def train_command(overrides: list[str], *, print_cfg: str | None = None) -> dict[str, float] | None:
    """``rlx train``: returns the final metrics, or None when it only printed the config."""
    cfg = compose(overrides)
    if print_cfg:
        print(OmegaConf.to_yaml(cfg if print_cfg == "all" else job_config(cfg)), end="")
        return None
    validate(cfg)
    job = job_config(cfg)
    choices = choices_of(cfg)
    tags = {
        "rlx.algo": str(choices["algo"]),
        "rlx.ablate": ",".join(ablations(choices)) or "none",
        "rlx.overrides": " ".join(overrides),
        "rlx.study": os.environ.get("RLX_STUDY", ""),
        "rlx.seed": str(job.seed),
        "rlx.git_sha": git_sha(),
    }
    progress = Progress()
    tracker = make_tracker(job, run_name(cfg))
    tracker.connect()  # a bad tracking URI fails here, before any work
    from rlx_cli.build import build
    from rlx_cli.loop import train

    parts = build(job, progress)
    output_dir = Path(job.trainer.output_dir)
    tracker.start(job, tags)
    started = time.perf_counter()
    try:
        final = train(job, parts, tracker, progress)
        final["perf/total_s"] = time.perf_counter() - started
        save_final(parts, output_dir)
        write_json(output_dir / "metrics.json", final)
        tracker.log_artifact(output_dir / "metrics.json")
    except KeyboardInterrupt:
        tracker.end("KILLED", error="interrupted")
        raise
    except BaseException as error:
        tracker.end("FAILED", error=f"{type(error).__name__}: {error}")
        raise
    tracker.end("FINISHED")
    print_summary(final, tracker.run_id, output_dir, job)
    return final


def save_final(parts, output_dir: Path) -> None:
    """Policy (full weights or the LoRA adapter), tokenizer and critic in safetensors, written atomically."""
    from safetensors.torch import save_file

    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=output_dir, prefix=".final-"))
    parts.models.policy.save_pretrained(tmp, safe_serialization=True)
    parts.models.tokenizer.save_pretrained(tmp)
    if parts.models.critic is not None:
        state = {k: v.contiguous() for k, v in parts.models.critic.state_to_save().items()}
        save_file(state, str(tmp / "critic.safetensors"))
    final = output_dir / "final"
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def print_summary(final: dict[str, float], run_id: str | None, output_dir: Path, cfg: DictConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rlx train: done", show_header=False)
    for key in ("eval/accuracy", "eval/accuracy_sampled", "train/reward", "train/response_len", "perf/total_s"):
        if key in final:
            table.add_row(key, f"{final[key]:.3f}")
    table.add_row("output", str(output_dir))
    if run_id:
        table.add_row("mlflow run", f"{run_id} in experiment '{cfg.tracking.experiment}' at {tracking_uri()}")
        table.add_row("browse", f"mlflow ui --backend-store-uri {tracking_uri()}")
    Console(file=sys.stdout).print(table)
