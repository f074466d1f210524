"""The share of an rlx step that is not model compute: sampling glue, scoring, components, logging, tracking.

    python benchmarks/overhead.py                          # rlx train (GRPO on the tiny default), 20 steps
    python benchmarks/overhead.py --profile 25             # and cProfile's top 25 functions by own time
    python benchmarks/overhead.py -- algo=vapo model.finetune=lora   # any rlx train overrides after --

``rlx train`` runs in this process with its default tracking (MLflow, a throwaway sqlite store) and one
thread. Model compute is the time inside HF ``generate`` (or rollout=fast's decode loop), every
policy/reference/critic forward (``Scorer.forward``, the critic), ``backward``, gradient clipping and the
optimizers' ``step``; everything else in a step (from one step's start to the next one's, logging included) is
overhead. Medians over the steps after ``--warmup``. Start-up (imports, compose, build, the first evaluation) is
reported apart.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Timers, load, one_thread, peak_rss_mib, table, versions, write_json  # noqa: E402

COMPUTE = ("generate", "forward", "backward", "optimizer")
PHASES = (*COMPUTE, "tracking")  # tracking: the per-step log_metrics call, part of the overhead


def instrument(timers: Timers) -> None:
    """Time the model compute: wrappers on generate, the loop's forwards, backward and the optimizer steps."""
    import torch
    from transformers.generation.utils import GenerationMixin

    from rlx_cli.engine import logprobs, models
    from rlx_cli.loops import loop, track
    from rlx_cli.sampling import fast_rollout

    GenerationMixin.generate = timers.wrap(GenerationMixin.generate, "generate")
    fast_rollout.decode = timers.wrap(fast_rollout.decode, "generate")  # rollout=fast's loop, in place of generate
    for cls in (logprobs.Scorer, models.Critic):  # a LoRA critic's body runs through the policy's Scorer
        cls.forward = timers.wrap(cls.forward, "forward")
    torch.Tensor.backward = timers.wrap(torch.Tensor.backward, "backward")
    torch.optim.AdamW.step = timers.wrap(torch.optim.AdamW.step, "optimizer")
    torch.nn.utils.clip_grad_norm_ = timers.wrap(torch.nn.utils.clip_grad_norm_, "optimizer")
    for cls in (track.MlflowTracker, track.NullTracker):
        cls.log_metrics = timers.wrap(cls.log_metrics, "tracking")
    sample_groups = loop.sample_groups

    def starting(cfg, parts, step, *rest):
        if step > 0:
            timers.start_step()
        return sample_groups(cfg, parts, step, *rest)

    loop.sample_groups = starting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N by own time")
    parser.add_argument("--json", default=None)
    parser.add_argument("extra", nargs="*", help="more rlx train overrides (after --)")
    args = parser.parse_args()

    one_thread()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    scratch = Path(tempfile.mkdtemp(prefix="rlx-overhead-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{scratch}/mlflow.db"
    timers = Timers(PHASES)
    instrument(timers)
    from rlx_cli.loops import run

    overrides = [
        f"trainer.steps={args.warmup + args.steps + 1}",
        "trainer.eval_every=0",
        "trainer.ckpt_every=0",
        "trainer.threads=1",
        f"trainer.output_dir={scratch}/out",
        *args.extra,
    ]
    before = load()
    start = time.perf_counter()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    run.train_command(overrides)
    if profiler:
        profiler.disable()
    total = time.perf_counter() - start
    result = timers.summary(args.warmup, compute=COMPUTE)
    in_steps = timers.step_starts[-1] - timers.step_starts[0]
    result.update(
        overrides=overrides,
        total_s=total,
        outside_steps_s=total - in_steps,
        peak_rss_mib=peak_rss_mib(),
        load_before=before,
        load_after=load(),
        versions=versions("rlx", "transformers", "torch", "peft", "mlflow"),
    )
    rows = [[name, f"{result[f'{name}_s'] * 1000:.1f}"] for name in PHASES]
    rows += [
        ["overhead (all but compute)", f"{result['rest_s'] * 1000:.1f}"],
        ["step", f"{result['step_s'] * 1000:.1f}"],
    ]
    print(table(["phase", "ms per step (median)"], rows))
    print(f"overhead share of a step: {result['rest_share']:.1%} (median over {result['steps_measured']} steps)")
    print(f"outside the steps (start-up, evaluations, saving): {result['outside_steps_s']:.1f} s of {total:.1f} s")
    print(f"load (1 min): {before['load1']} -> {result['load_after']['load1']} on {before['cores']} cores")
    if profiler:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
        print(text.getvalue())
        result["profile_top"] = text.getvalue()
    print(f"wrote {write_json('overhead', result, args.json)}")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
