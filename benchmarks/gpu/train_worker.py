"""One ``rlx train`` in this process for benchmarks/gpu/rlx_train.py: every step's metrics to ``--steps-json``, and
with ``--profile-step N`` the update of step N under ``torch.profiler`` (CPU and GPU), its operators' table, by
time on the device, to ``--profile-table``. The profiled step's own times carry the profiler's cost: the bench
reports the step before it.

    python benchmarks/gpu/train_worker.py --steps-json S.json [--profile-step 3 --profile-table T.txt] -- OVERRIDES
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from rlx_cli.loops import loop, run


def record_steps(path: Path) -> None:
    """Each step's logged metrics (train, perf, eval) and what ran (``in_effect``) appended to the JSON list at
    ``path`` as the step ends."""
    steps, inner = [], loop.log_step

    def log_step(cfg, parts, tracker, progress, step, metrics, last):
        inner(cfg, parts, tracker, progress, step, metrics, last)
        steps.append({"step": step, **metrics, "in_effect": in_effect(parts)})
        path.write_text(json.dumps(steps, indent=1) + "\n")

    loop.log_step = log_step


def in_effect(parts) -> dict:
    """Whether the update ran rlx's own forward, compiled, and the sampler CUDA graphs: what the config asked for
    reaches them only through the build (``trainer.compile``, ``rollout.cuda_graphs``), so the figures say it."""
    from rlx_cli.engine import decoder
    from rlx_cli.engine.logprobs import causal_lm
    from rlx_cli.sampling.cuda_graphs import enabled

    graphs = getattr(parts.sampler, "cuda_graphs", None)  # rollout=fast's setting
    return {
        "own_forward": decoder.trains(causal_lm(parts.models.policy)),
        "compiled": parts.models.scorer.compiled,
        "cuda_graphs": None if graphs is None else enabled(graphs, parts.models.device),
    }


def profile_update(step_wanted: int, table: Path, rows: int = 40) -> None:
    """Step ``step_wanted``'s update (``loop.update_step``) under ``torch.profiler``; its wall time and the table of
    its operators and kernels by self time on the device (the table's last line: the kernels' total) to ``table``."""
    from torch.profiler import ProfilerActivity, profile

    inner = loop.update_step

    def update_step(cfg, parts, state, step, *rest):
        if step != step_wanted:
            return inner(cfg, parts, state, step, *rest)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        started = time.perf_counter()
        with profile(activities=activities) as prof:
            out = inner(cfg, parts, state, step, *rest)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        wall = time.perf_counter() - started
        head = f"update of step {step} under the profiler: {wall:.2f} s wall\n"
        table.write_text(head + prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows) + "\n")
        return out

    loop.update_step = update_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps-json", required=True, type=Path)
    parser.add_argument("--profile-step", type=int, default=0, help="0: none")
    parser.add_argument("--profile-table", type=Path)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    record_steps(args.steps_json)
    if args.profile_step:
        profile_update(args.profile_step, args.profile_table)
    run.train_command(args.overrides)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
