"""Peak RSS of ``rlx train algo=grpo`` vs ``algo=vapo``, with LoRA and with full fine-tuning.

    python benchmarks/memory.py                       # 2 rounds, order alternating, tiny default
    python benchmarks/memory.py --steps 3 --rounds 1  # quicker

Each run is its own ``rlx train`` process (one thread, ``tracking=none``, value pretraining shortened to
``--value-pretrain-steps``: it adds time, not memory); its peak RSS is the kernel's figure for that child
(``wait4``'s ``ru_maxrss``). Extra ``rlx train`` overrides after ``--`` apply to every run, e.g.
``-- model=hf model.path=DIR`` for another model.
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


def peak_rss(argv: list[str]) -> tuple[float, float]:
    """Run ``argv``; -> (its peak RSS in MiB, wall seconds). Output goes to a log shown only on failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise SystemExit(f"failed: {' '.join(argv)}")
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=["grpo", "vapo"])
    parser.add_argument("--finetunes", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--value-pretrain-steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument("extra", nargs="*", help="more rlx train overrides (after --)")
    args = parser.parse_args()

    rlx = shutil.which("rlx") or "rlx"
    runs = []
    for r in range(args.rounds):
        plan = [(a, f) for f in args.finetunes for a in args.algos]
        for algo, finetune in plan if r % 2 == 0 else plan[::-1]:
            out = tempfile.mkdtemp(prefix="rlx-mem-")
            argv = [
                rlx,
                "train",
                f"algo={algo}",
                f"model.finetune={finetune}",
                f"trainer.steps={args.steps}",
                "trainer.eval_every=0",
                "trainer.ckpt_every=0",
                "trainer.threads=1",
                "tracking=none",
                f"trainer.output_dir={out}",
                *args.extra,
            ]
            if algo == "vapo":
                argv.append(f"value_pretrain.steps={args.value_pretrain_steps}")
            if args.dry_run:
                print(" ".join(argv))
                continue
            before = load()
            rss, wall = peak_rss(argv)
            shutil.rmtree(out, ignore_errors=True)
            runs.append(
                {
                    "algo": algo,
                    "finetune": finetune,
                    "round": r,
                    "peak_rss_mib": rss,
                    "wall_s": wall,
                    "load_before": before,
                    "load_after": load(),
                    "argv": argv[1:],
                }
            )
            print(
                f"round {r} {algo:5s} {finetune:4s}: {rss:.0f} MiB in {wall:.0f} s, load {before['load1']}", flush=True
            )
    if args.dry_run:
        return
    rows, summary = [], []
    for finetune in args.finetunes:
        rss = {
            a: median([x["peak_rss_mib"] for x in runs if x["algo"] == a and x["finetune"] == finetune])
            for a in args.algos
        }
        entry = {"finetune": finetune, **{f"{a}_mib": v for a, v in rss.items()}}
        if {"grpo", "vapo"} <= set(rss):
            entry["vapo_over_grpo"] = rss["vapo"] / rss["grpo"]
        summary.append(entry)
        rows.append(
            [finetune, *(f"{rss[a]:.0f}" for a in args.algos), f"{entry.get('vapo_over_grpo', float('nan')):.2f}"]
        )
    print(table(["finetune", *(f"{a} peak RSS MiB" for a in args.algos), "vapo / grpo"], rows))
    loads = [x[k]["load1"] for x in runs for k in ("load_before", "load_after")]
    print(f"load (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} on {load()['cores']} cores")
    path = write_json(
        "memory",
        {
            "args": vars(args),
            "versions": versions("rlx", "transformers", "torch", "peft"),
            "summary": summary,
            "runs": runs,
        },
        args.json,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
