"""DAPO's sample accounting (reports/dapo-accounting.md), from the MLflow store its plan ran into.

    cd DIR && python reports/dapo-accounting/accounting.py --out reports/dapo-accounting
    # the store: $MLFLOW_TRACKING_URI, default ./mlflow.db (as for rlx report)

Per run, from the per-step ``train/draws`` and ``train/groups_kept`` and the last ``perf/samples``: the steps, the
answers drawn, the sampling passes, the steps that needed more than one, the groups drawn, kept (used in a batch or
carried on) and dropped. Per arm: the means over seeds and the answers drawn per step against GRPO's. Writes
accounting-per-run.csv and accounting.md to --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

EXPERIMENT = "dapo-accounting"


def arm_and_seed(run) -> tuple[str, str]:
    """The run's arm and seed: the tags ``rlx sweep --plan`` sets, else (runs made by the run script before the plan)
    its folder's name, runs/<arm>-s<seed>."""
    tags = run.data.tags
    if tags.get("rlx.arm") and tags.get("rlx.seed", "").isdigit():
        return tags["rlx.arm"], tags["rlx.seed"]
    arm, seed = Path(run.data.params["trainer.output_dir"]).name.rsplit("-s", 1)  # e.g. dapo_carry-s3
    return arm, seed


def runs() -> pd.DataFrame:
    from rlx_cli.studies.runs import connect, histories, load_runs

    found = load_runs(EXPERIMENT, None)
    logged = histories(connect()[1], found, ["train/draws", "train/groups_kept"])
    rows = []
    for run in found:
        arm, seed = arm_and_seed(run)
        prompts = int(run.data.params["rollout.prompts_per_step"])
        draws, kept = ([v for _, v in logged[run.info.run_id, key]] for key in ("train/draws", "train/groups_kept"))
        rows.append(
            {
                "arm": arm, "seed": int(seed), "steps": len(draws), "samples": run.data.metrics["perf/samples"],
                "draws": sum(draws), "refill_steps": sum(d > 1 for d in draws),
                "groups_drawn": prompts * sum(draws), "groups_kept": sum(kept),
                "groups_dropped": prompts * sum(draws) - sum(kept), "run_id": run.info.run_id,
            }
        )  # fmt: skip
    return pd.DataFrame(rows).sort_values(["arm", "seed"]).reset_index(drop=True)


def arms(per_run: pd.DataFrame, baseline: str = "grpo") -> pd.DataFrame:
    table = per_run.groupby("arm")[["steps", "samples", "draws", "refill_steps", "groups_drawn", "groups_kept",
                                    "groups_dropped"]].mean()  # fmt: skip
    per_step = table.samples / table.steps
    table["samples_per_step_vs_baseline"] = per_step / per_step[baseline]
    table["dropped_share"] = table.groups_dropped / table.groups_drawn
    return table


def markdown(table: pd.DataFrame) -> str:
    head = "| arm | steps | answers drawn | × GRPO's a step | sampling passes | steps with a refill | groups drawn | kept | dropped (share) |"  # noqa: E501
    lines = [head, "|" + " --- |" * 9]
    for arm, r in table.iterrows():
        lines.append(
            f"| {arm} | {r.steps:.0f} | {r.samples:,.0f} | {r.samples_per_step_vs_baseline:.2f} | {r.draws:.1f} | "
            f"{r.refill_steps:.1f} | {r.groups_drawn:,.0f} | {r.groups_kept:,.1f} | "
            f"{r.groups_dropped:,.1f} ({100 * r.dropped_share:.1f}%) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    per_run = runs()
    table = arms(per_run)
    args.out.mkdir(parents=True, exist_ok=True)
    per_run.to_csv(args.out / "accounting-per-run.csv", index=False)
    (args.out / "accounting.md").write_text(markdown(table))
    print(markdown(table))


if __name__ == "__main__":
    main()
