"""Sampling overlapped with training: wall time to the same samples with ``rollout.overlap`` and without, lag 1 both.

    python benchmarks/overlap.py                          # the default and long_sums, 3 alternating rounds
    python benchmarks/overlap.py --rounds 2 --json benchmarks/results/overlap_default_threads.json
    python benchmarks/overlap.py --arms sequential-1 sequential overlap overlap-1 --rounds 3   # the 1-thread arms too
    python benchmarks/overlap.py --tasks sums --rounds 1 --steps 10 --dry-run

Per task and round, ``rlx train rollout.lag=1`` runs of the same steps, in an order that rotates between rounds:

- ``sequential``: what a user runs, sampling and the update one after the other with torch's default threads;
- ``overlap``: ``rollout.overlap=true`` as a user runs it: the trainer and the sampler process split the cores
  between them by default (``build.thread_counts``; one thread each on 2 cores);
- ``sequential-1`` and ``overlap-1``: the same with one thread (``trainer.threads=1``; overlap's sampler one too).

Each run logs ``perf/wall_s`` (seconds inside the training loop) at every step; the figures are ``steady``: from the end
of step ``--warmup`` to the end of the last step (the evaluations at step 0 and at the end left out, as the sampler
process's start-up), ``total``: from the end of step 0 (its evaluation) to the end of the last step, start-up
included, and ``process``: the whole ``rlx train`` command as a user waits for it. Ratios are each overlap arm against
each sequential arm, medians over the rounds of the per-round ratios. The load average before and after each run is
in the JSON: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, median, table, versions, write_json  # noqa: E402

ARMS = {
    "sequential": [],
    "overlap": ["rollout.overlap=true"],
    "sequential-1": ["trainer.threads=1"],
    "overlap-1": ["rollout.overlap=true", "trainer.threads=1", "rollout.threads=1"],
}
FIGURES = ("steady_s", "total_s", "process_s")
TASKS = ("sums", "long_sums")


def wall_times(store: Path) -> dict[int, float]:
    """step -> ``perf/wall_s`` of the one run in the MLflow store at ``store``."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}")
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "perf/wall_s")
    return {m.step: m.value for m in history}


def run_arm(arm: str, task: str, steps: int, warmup: int, seed: int) -> dict:
    """One ``rlx train`` -> its steady and total seconds, samples and the load around it."""
    work = Path(tempfile.mkdtemp(prefix="rlx-overlap-"))
    argv = ["rlx", "train", f"task={task}", "rollout.lag=1", f"trainer.steps={steps}", "trainer.eval_every=0",
            "trainer.ckpt_every=0", f"seed={seed}", f"trainer.output_dir={work / 'out'}", *ARMS[arm]]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    before, start = load(), time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"failed: {' '.join(argv)}")
    wall = wall_times(work / "mlflow.db")
    shutil.rmtree(work, ignore_errors=True)
    return {
        "arm": arm, "task": task, "steady_s": wall[steps] - wall[warmup], "total_s": wall[steps] - wall[0],
        "process_s": time.perf_counter() - start, "load_before": before, "load_after": load(), "argv": argv[1:],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--arms", nargs="+", default=["sequential", "overlap"], choices=list(ARMS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the steady figure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="where to write the results (default benchmarks/results/)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = parser.parse_args()

    plan = [
        (round_, task, arm)
        for round_ in range(args.rounds)
        for task in args.tasks
        for arm in args.arms[round_ % len(args.arms) :] + args.arms[: round_ % len(args.arms)]  # the order rotates
    ]
    if args.dry_run:
        for round_, task, arm in plan:
            print(f"round {round_}: task={task} {arm}: rlx train rollout.lag=1 {' '.join(ARMS[arm])}")
        return
    runs = []
    for round_, task, arm in plan:
        result = {**run_arm(arm, task, args.steps, args.warmup, args.seed), "round": round_}
        print(f"round {round_} task={task:9s} {arm:12s} steady {result['steady_s']:6.1f} s  total "
              f"{result['total_s']:6.1f} s  process {result['process_s']:6.1f} s  "
              f"load {result['load_before']['load1']}", flush=True)  # fmt: skip
        runs.append(result)
    ratios, rows = {}, []
    pairs = [(a, b) for a in args.arms if a.startswith("overlap") for b in args.arms if b.startswith("sequential")]
    for task in args.tasks:
        for arm, base in pairs:
            for figure in FIGURES:
                per_round = [
                    pick(runs, r, task, arm)[figure] / pick(runs, r, task, base)[figure] for r in range(args.rounds)
                ]
                ratios[f"{task}/{arm}_vs_{base}/{figure}"] = {"median": median(per_round), "rounds": per_round}
                each = " ".join(f"{x:.2f}" for x in per_round)
                rows.append([task, arm, base, figure[:-2], f"{median(per_round):.2f}", each])
    print(table(["task", "arm", "against", "figure", "overlap / sequential (median)", "each round"], rows))
    data = {"args": vars(args), "ratios": ratios, "runs": runs, "versions": versions("rlx", "torch", "transformers")}
    print(f"wrote {write_json('overlap', data, args.json)}")


def pick(runs: list[dict], round_: int, task: str, arm: str) -> dict:
    return next(r for r in runs if (r["round"], r["task"], r["arm"]) == (round_, task, arm))


if __name__ == "__main__":
    main()
