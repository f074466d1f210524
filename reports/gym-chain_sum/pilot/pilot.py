"""The gym pilot's table (reports/gym-chain_sum.md, "Pilot"), from the MLflow store its plans ran into.

    cd DIR && python reports/gym-chain_sum/pilot/pilot.py --out reports/gym-chain_sum/pilot
    # the store: $MLFLOW_TRACKING_URI, default ./mlflow.db (as for rlx report)

Per run (arm = <difficulty>-u<updates per rollout>, the plan's name in the tag ``rlx.arm``; the difficulties are easy,
hard and plan-levels.yaml's curriculum levels): the base's step-0 and the final greedy and sampled accuracy and the
final sampled accuracy's evaluation SE (``eval/accuracy_sampled_se``). Per cell: the sampled gain (final − step 0,
paired by seed) and its verdict, σ (the larger of the seeds' std of the final and the mean evaluation SE), the MDE a
5-seed paired comparison of two arms would have (√2·σ/√5 as its SE, 4 degrees of freedom, 80% power at α 0.05:
``rlx_cli.studies.power.detectable``) and the rule: gain ≥ 3 × MDE. Writes pilot-per-run.csv, pilot-curves.csv,
pilot-grid.csv, pilot-grid.md and pilot-curves.png to --out.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

EXPERIMENT = "gym-pilot"
STUDY_SEEDS = 5  # the study the MDE is for
COST = {2: 1, 16: 1, 64: 4}  # updates per rollout -> backward passes over each rollout batch (epochs)
CONTROL = "noop"  # plan-long.yaml's no-op arm: a plan's second arm, no cell of the grid


def arm_and_seed(run) -> tuple[str, str]:
    """The run's arm and seed: the tags ``rlx sweep --plan`` sets, else (runs made by the run scripts before the plans)
    its folder's name, runs/<arm>-s<seed>."""
    tags = run.data.tags
    if tags.get("rlx.arm") and tags.get("rlx.seed", "").isdigit():
        return tags["rlx.arm"], tags["rlx.seed"]
    arm, seed = Path(run.data.params["trainer.output_dir"]).name.rsplit("-s", 1)  # e.g. easy-u16-s1
    return arm, seed


def runs(experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run, the sampled accuracy curves: arm, seed, step, value)."""
    from rlx_cli.studies.runs import connect, histories, load_runs

    found = load_runs(experiment, None)
    logged = histories(connect()[1], found, ["eval/accuracy", "eval/accuracy_sampled", "eval/accuracy_sampled_se"])
    rows, curves = [], []
    for run in found:
        arm, seed = arm_and_seed(run)
        if arm == CONTROL:
            continue
        difficulty, updates = arm.split("-u")
        greedy, sampled, sampled_se = (
            dict(logged[run.info.run_id, key])
            for key in ("eval/accuracy", "eval/accuracy_sampled", "eval/accuracy_sampled_se")
        )
        last = max(sampled)
        rows.append(
            {
                "difficulty": difficulty, "updates": int(updates), "seed": int(seed),
                "greedy_base": greedy[0], "greedy_final": greedy[last],
                "sampled_base": sampled[0], "sampled_final": sampled[last], "sampled_final_se": sampled_se[last],
                "run_id": run.info.run_id,
            }
        )  # fmt: skip
        curves += [{"arm": arm, "seed": int(seed), "step": s, "value": v} for s, v in sorted(sampled.items())]
    per_run = pd.DataFrame(rows).sort_values(["difficulty", "updates", "seed"]).reset_index(drop=True)
    return per_run, pd.DataFrame(curves).sort_values(["arm", "seed", "step"]).reset_index(drop=True)


def cells(per_run: pd.DataFrame) -> pd.DataFrame:
    from rlx_cli.studies.comparison import std
    from rlx_cli.studies.power import detectable
    from rlx_cli.studies.stats import verdict

    rows = []
    for (difficulty, updates), g in per_run.groupby(["difficulty", "updates"], sort=True):
        gain = g.sampled_final - g.sampled_base
        sigma = pd.Series([std(list(g.sampled_final)), g.sampled_final_se.mean()]).max()  # one seed: its SE
        mde = detectable(math.sqrt(2) * sigma / math.sqrt(STUDY_SEEDS), STUDY_SEEDS - 1, level=0.05)
        called = verdict(list(g.sampled_final), list(g.sampled_base), margin=0.02)
        rows.append(
            {
                "difficulty": difficulty, "updates": updates, "seeds": len(g),
                "greedy_base": g.greedy_base.mean(), "greedy_final": g.greedy_final.mean(),
                "sampled_base": g.sampled_base.mean(), "sampled_final": g.sampled_final.mean(),
                "gain": gain.mean(), "verdict": called.label, "p": called.p,
                "sigma": sigma, "mde": mde, "passes": gain.mean() >= 3 * mde,
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


def chosen(grid: pd.DataFrame, difficulty: str) -> pd.Series | None:
    """The rule: the cheapest passing cell of a difficulty (compute, then updates per rollout)."""
    own = grid[grid.difficulty == difficulty].assign(cost=lambda g: g.updates.map(COST))
    passing = own[own.passes].sort_values(["cost", "updates"])
    return None if passing.empty else passing.iloc[0]


def markdown(grid: pd.DataFrame) -> str:
    head = "| difficulty | updates | greedy base → final | sampled base → final | gain | verdict (p) | σ | MDE (5 seeds) | 3 × MDE | passes |"  # noqa: E501
    lines = [head, "|" + " --- |" * 10]
    for _, c in grid.iterrows():
        lines.append(
            f"| {c.difficulty} | {c.updates} | {c.greedy_base:.3f} → {c.greedy_final:.3f} | "
            f"{c.sampled_base:.3f} → {c.sampled_final:.3f} | {c.gain:+.3f} | {c.verdict} ({c.p:.3g}) | "
            f"{c.sigma:.3f} | {c.mde:.3f} | {3 * c.mde:.3f} | {'yes' if c.passes else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def difficulties_of(names: pd.Series) -> list[str]:
    """The difficulties in the order the report reads them: the study's halves, then the curriculum's levels."""
    found = set(names.str.split("-u").str[0])
    return [d for d in ["easy", "hard"] if d in found] + sorted(found - {"easy", "hard"})


def plot(curves: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    difficulties = difficulties_of(curves.arm)
    cols = min(2, len(difficulties))
    rows = math.ceil(len(difficulties) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), constrained_layout=True, squeeze=False)
    colors = {2: "tab:orange", 16: "tab:blue", 64: "tab:green"}  # one colour per update setting in every panel
    for ax, difficulty in zip(axes.flat, difficulties, strict=False):
        for updates, color in colors.items():
            g = curves[curves.arm == f"{difficulty}-u{updates}"]
            if g.empty:
                continue
            mean = g.groupby("step").value.mean()
            ax.plot(mean.index, mean.values, marker="o", color=color, label=f"{updates} updates a rollout (mean)")
            for _, seed in g.groupby("seed"):
                ax.plot(seed.step, seed.value, color=color, alpha=0.3, lw=0.8)
        ax.set_title(f"GRPO on chain_sum, {difficulty}")
        ax.set_xlabel("step (128 samples each)")
        ax.set_ylabel("sampled accuracy (4 answers a prompt)")
        ax.legend()
    for ax in axes.flat[len(difficulties) :]:
        ax.set_visible(False)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--experiment", default=EXPERIMENT, help="gym-pilot-long: plan-long.yaml's runs")
    args = parser.parse_args()
    per_run, curves = runs(args.experiment)
    grid = cells(per_run)
    args.out.mkdir(parents=True, exist_ok=True)
    per_run.to_csv(args.out / "pilot-per-run.csv", index=False)
    curves.to_csv(args.out / "pilot-curves.csv", index=False)
    grid.to_csv(args.out / "pilot-grid.csv", index=False)
    (args.out / "pilot-grid.md").write_text(markdown(grid))
    plot(curves, args.out / "pilot-curves.png")
    print(markdown(grid))
    for difficulty in difficulties_of(grid.difficulty):
        pick = chosen(grid, difficulty)
        print(f"{difficulty}:", "none passes" if pick is None else f"{pick.updates} updates per rollout")


if __name__ == "__main__":
    main()
