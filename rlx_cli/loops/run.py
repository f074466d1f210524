"""One ``rlx train``: compose → validate → build → loop → track, with a FAILED/KILLED run on errors.

Exit codes: 0 done, 2 a mistake in the input (nothing run, nothing written), 1 the training diverged
(``trainer.max_skipped``), 130/143 stopped by Ctrl-C/SIGTERM (a checkpoint written when the loop had started).
"""

from __future__ import annotations

import gc
import importlib
import os
import shlex
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf

from rlx_cli.config.compose import ablations, choices_of, compose, job_config
from rlx_cli.config.validate import validate
from rlx_cli.loops.progress import Progress
from rlx_cli.loops.signals import Stopped, StopRequests
from rlx_cli.loops.track import git_sha, make_tracker, tracking_uri, write_json

# trainer.loop (its valid names: config/choices.py's TRAINING_LOOPS, which validate checks without importing the
# loops) -> the module whose train(cfg, parts, tracker, progress, stop, state) runs the steps
LOOPS = {
    "rl": "rlx_cli.loops.loop",
    "rft": "rlx_cli.loops.rft",
    "dpo": "rlx_cli.loops.dpo",
    "online_dpo": "rlx_cli.loops.online_dpo",
}


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
    if job.launcher.name == "torchrun" and "WORLD_SIZE" not in os.environ:
        become_torchrun(overrides, job.launcher.nproc_per_node)
    with collector_paused():
        from rlx_cli.engine import distributed  # torch: only once the config is known to be good
        from rlx_cli.engine.allocator import map_large_allocations
        from rlx_cli.loops import checkpoint
        from rlx_cli.loops.build import build

        # from the first allocation on: glibc's moving threshold let sampling's [rows, vocabulary] tensors pile up
        # in the heap, so that identical runs peaked at 960 or 3,270 MiB (docs/benchmarks.md, Scaling)
        map_large_allocations()
        distributed.start()  # under torchrun: join the other processes (rank 0 tracks and writes files)
        checkpoint.check_output_dir(job)
        choices = choices_of(cfg)
        tags = {
            "rlx.algo": str(choices["algo"]),
            "rlx.ablate": ",".join(ablations(choices)) or "none",
            "rlx.overrides": shlex.join(overrides),  # shell words: an override may hold spaces
            "rlx.study": os.environ.get("RLX_STUDY", ""),
            "rlx.arm": os.environ.get("RLX_ARM", ""),  # a declared study's name for the arm (study_plan.py)
            "rlx.seed": str(job.seed),
            "rlx.git_sha": git_sha(),
            "rlx.processes": str(distributed.size()),
        }
        progress = Progress(silent=not distributed.is_main())
        tracker = make_tracker(job, run_name(cfg))
        tracker.connect()  # a bad tracking URI fails here, before any work
        train = importlib.import_module(LOOPS[job.trainer.loop]).train
    output_dir = Path(job.trainer.output_dir)
    with StopRequests() as stop, exit_on_stop():
        with collector_paused():
            parts = build(job, progress)
        state = checkpoint.resume(job, parts, progress)
        tracker.start(job, tags, run_id=state.run_id)
        state.run_id = tracker.run_id
        started = time.perf_counter()
        with ending(tracker, output_dir):
            with stop.deferred():
                final = dict(train(job, parts, tracker, progress, stop, state))
            final["perf/total_s"] = time.perf_counter() - started
            save_final(parts, output_dir)
            if distributed.is_main():
                write_json(output_dir / "metrics.json", final)
                tracker.log_artifact(output_dir / "metrics.json")
    if distributed.is_main():
        print_summary(final, tracker.run_id, output_dir, job)
    return final


@contextmanager
def collector_paused():
    """Python's garbage collector off while a run imports torch, transformers, peft and MLflow and builds its
    models. Those imports make millions of objects that live as long as the process, and with the collector on,
    each time the heap had grown by a quarter a full collection went over all of them: 9 during a 3-step run's
    start, 1.4 of its 9.6 CPU s (now one, and the run about 8.3 CPU s; its peak memory the same). What they leave
    behind is collected once the collector is back on."""
    if not gc.isenabled():  # paused already (an outer pause, or the caller's choice): left as it is
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def become_torchrun(overrides: list[str], processes: int) -> NoReturn:
    """``launcher=torchrun``: replace this process by torchrun, which starts ``processes`` × ``rlx train OVERRIDES``
    on 127.0.0.1 (signals then reach torchrun, which passes them on to every process)."""
    import socket

    with socket.socket() as probe:  # a free port for the processes' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run = ["-m", "torch.distributed.run", f"--nproc-per-node={processes}", "--master-addr=127.0.0.1"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *run, f"--master-port={port}", "-m", "rlx_cli", "train", *overrides])


@contextmanager
def exit_on_stop():
    """A signal: one line on stderr and exit 128 + its number."""
    try:
        yield
    except Stopped as stopped:
        print(f"rlx train: {stopped}", file=sys.stderr)
        raise SystemExit(stopped.code) from None


@contextmanager
def ending(tracker, output_dir: Path):
    """End the tracked run FINISHED; KILLED on a signal; FAILED on anything else (a divergence exits 1)."""
    from rlx_cli.loops import checkpoint
    from rlx_cli.loops.guard import Diverged

    try:
        yield
    except Stopped as stopped:
        tracker.end("KILLED", error=str(stopped))
        raise
    except Diverged as error:
        tracker.end("FAILED", error=str(error))
        last = checkpoint.latest(output_dir)
        print(f"error: training diverged: {error}; last good checkpoint: {last or 'none'}", file=sys.stderr)
        raise SystemExit(1) from None
    except BaseException as error:
        tracker.end("FAILED", error=f"{type(error).__name__}: {error}")
        raise
    tracker.end("FINISHED")


def save_final(parts, output_dir: Path) -> None:
    """Policy (full weights or the LoRA adapter), tokenizer and critic in safetensors, written atomically by rank 0
    (every process calls it: sharded weights are gathered whole first)."""
    from safetensors.torch import save_file

    from rlx_cli.engine import distributed
    from rlx_cli.engine.sharding import full_tensors

    models = parts.models
    policy = full_tensors(models.policy.state_dict())
    critic = full_tensors(models.critic.state_to_save()) if models.critic is not None else None
    if not distributed.is_main():
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=output_dir, prefix=".final-"))
    models.policy.save_pretrained(tmp, state_dict=policy, safe_serialization=True)
    models.tokenizer.save_pretrained(tmp)
    if critic is not None:
        save_file(critic, str(tmp / "critic.safetensors"))
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
        server = tracking_uri().startswith(("http://", "https://"))
        table.add_row("browse", tracking_uri() if server else "rlx ui  (mlflow ui on this store, 127.0.0.1:5000)")
    Console(file=sys.stdout).print(table)
