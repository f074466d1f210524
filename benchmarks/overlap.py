"""Sampling overlapped with training: wall time to the same samples with ``rollout.overlap`` and without, lag 1 both.

    python benchmarks/overlap.py                          # the default and long_sums, 3 alternating rounds
    python benchmarks/overlap.py --tasks sums --rounds 1 --steps 10 --dry-run

Per task and round, three ``rlx train rollout.lag=1`` runs of the same steps, in an order that rotates between rounds:

- ``sequential``: sampling and the update one after the other, one torch thread (``trainer.threads=1``);
- ``sequential-2``: the same with two threads, the sequential loop's use of both cores;
- ``overlap``: ``rollout.overlap=true``, the trainer and the sampler process one thread each.

Each run logs ``perf/wall_s`` (seconds inside the training loop) at every step; the figures are ``steady``: from the end
of step ``--warmup`` to the end of the last step (the evaluations at step 0 and at the end left out, as the sampler
process's start-up), and ``total``: from the end of step 0 (its evaluation) to the end of the last step, start-up
included. Ratios are overlap against each sequential arm, medians over the rounds of the per-round ratios. The load
average before and after each run is in the JSON: the machine is shared.
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
    "sequential": ["trainer.threads=1"],
    "sequential-2": ["trainer.threads=2"],
    "overlap": ["rollout.overlap=true", "trainer.threads=1", "rollout.threads=1"],
}
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
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
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
              f"{result['total_s']:6.1f} s  load {result['load_before']['load1']}", flush=True)  # fmt: skip
        runs.append(result)
    ratios, rows = {}, []
    for task in args.tasks:
        for base in (a for a in args.arms if a != "overlap"):
            for figure in ("steady_s", "total_s"):
                per_round = [
                    pick(runs, r, task, "overlap")[figure] / pick(runs, r, task, base)[figure]
                    for r in range(args.rounds)
                ]
                ratios[f"{task}/overlap_vs_{base}/{figure}"] = {"median": median(per_round), "rounds": per_round}
                rows.append(
                    [task, base, figure[:-2], f"{median(per_round):.2f}", " ".join(f"{x:.2f}" for x in per_round)]
                )
    print(table(["task", "against", "figure", "overlap / sequential (median)", "each round"], rows))
    data = {"args": vars(args), "ratios": ratios, "runs": runs, "versions": versions("rlx", "torch", "transformers")}
    print(f"wrote {write_json('overlap', data, args.json)}")


def pick(runs: list[dict], round_: int, task: str, arm: str) -> dict:
    return next(r for r in runs if (r["round"], r["task"], r["arm"]) == (round_, task, arm))


if __name__ == "__main__":
    main()
