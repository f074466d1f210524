"""Wall time of a whole ablation study: ``rlx ablate algo=vapo --seeds 2 --jobs 2`` on the tiny default.

    python benchmarks/study_time.py                   # the study: 8 arms x 2 seeds, 2 at a time (goal <= 30 min)
    python benchmarks/study_time.py --dry-run         # list its points and exit (seconds)
    python benchmarks/study_time.py --seeds 1 -- trainer.steps=5 value_pretrain.steps=2   # a quick smoke

It runs in a fresh working directory with its own MLflow store (nothing lands in the current one) and
records the wall time, the number of points, the load before and after, and the versions. Pass more
``rlx ablate`` overrides after ``--``. This one takes tens of minutes and two cores: run it on a quiet machine.
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
from _common import load, versions, write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="vapo")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="print the study's points and exit")
    parser.add_argument("--json", default=None)
    parser.add_argument("extra", nargs="*", help="more rlx ablate overrides (after --)")
    args = parser.parse_args()

    rlx = shutil.which("rlx") or "rlx"
    argv = [rlx, "ablate", f"algo={args.algo}", "--seeds", str(args.seeds), "--jobs", str(args.jobs), *args.extra]
    workdir = Path(tempfile.mkdtemp(prefix="rlx-study-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db"}
    if args.dry_run:
        argv.append("--dry-run")
    print("$ " + " ".join(argv[1:]).replace(rlx, "rlx"), flush=True)
    before = load()
    start = time.perf_counter()
    code = subprocess.call(argv, cwd=workdir, env=env)
    wall = time.perf_counter() - start
    if args.dry_run:
        shutil.rmtree(workdir, ignore_errors=True)
        raise SystemExit(code)
    points = sum((p / "worker.log").is_file() for p in (workdir / "outputs").glob("sweeps/*/*"))  # a folder per point
    result = {
        "command": ["rlx", *argv[1:]],
        "exit_code": code,
        "wall_s": wall,
        "wall_min": wall / 60,
        "points": points,
        "load_before": before,
        "load_after": load(),
        "versions": versions("rlx", "transformers", "torch", "peft", "mlflow"),
    }
    print(f"study wall time: {wall / 60:.1f} min ({points} points, exit {code}); goal <= 30 min")
    print(f"load (1 min): {before['load1']} -> {result['load_after']['load1']} on {before['cores']} cores")
    print(f"wrote {write_json('study_time', result, args.json)}")
    shutil.rmtree(workdir, ignore_errors=True)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
