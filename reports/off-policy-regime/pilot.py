"""The off-policy regime pilot's grid (reports/off-policy-regime.md), from the MLflow store its plan ran into.

    cd DIR && python reports/off-policy-regime/pilot.py --out reports/off-policy-regime
    # the store: $MLFLOW_TRACKING_URI, default ./mlflow.db (as for rlx report)

Per run (``rlx_cli.studies.runs``' FINISHED runs and histories): the base's step-0 and the final greedy and sampled
accuracy, their standard errors over the 500 prompts (the evaluation's own, ``rlx_cli.loops.evaluation``'s
``standard_error``, of one answer a prompt: √(p(1 − p)/(n − 1))), the clipped share of tokens at mid-run
(clip_frac_high + clip_frac_low, mean over steps 8–12) and `train/rollout_kl` (mean over the run). Per cell (lr ×
updates per rollout × lag): the means over seeds, the sampled gain's verdict (final against step 0, paired by seed,
`rlx_cli.studies.stats.verdict`) and the rule's three tests. Writes pilot-per-run.csv, pilot-grid.csv, pilot-grid.md
and pilot-heatmap.png to --out.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

EXPERIMENT = "off-policy-regime"
PROMPTS = 500  # task=long_sums' eval_size
MID = range(8, 13)  # the steps whose clipped share counts as mid-run
UPDATES = {(1, 4): 4, (4, 4): 16, (4, 16): 64}  # (epochs, minibatches) -> optimizer updates per rollout
METRICS = ["eval/accuracy", "eval/accuracy_sampled", "train/clip_frac_high", "train/clip_frac_low", "train/rollout_kl"]


def runs() -> pd.DataFrame:
    from rlx_cli.studies.runs import connect, histories, load_runs

    found = load_runs(EXPERIMENT, None)
    logged = histories(connect()[1], found, METRICS)
    rows = []
    for run in found:
        p = run.data.params
        history = {key: dict(logged[run.info.run_id, key]) for key in METRICS}  # metric -> {step: value}
        greedy, sampled = history["eval/accuracy"], history["eval/accuracy_sampled"]
        high, low, kl = history["train/clip_frac_high"], history["train/clip_frac_low"], history["train/rollout_kl"]
        last = max(greedy)
        rows.append(
            {
                "lr": float(p["trainer.lr"]),
                "updates": UPDATES[int(p["trainer.epochs"]), int(p["trainer.minibatches"])],
                "lag": int(p["rollout.lag"]),
                "seed": int(p["seed"]),
                "greedy_base": greedy[0],
                "greedy_final": greedy[last],
                "sampled_base": sampled[0],
                "sampled_final": sampled[last],
                "clipped_mid": sum(high.get(s, 0.0) + low.get(s, 0.0) for s in MID) / len(MID),
                "rollout_kl": sum(kl.values()) / len(kl),
                "run_id": run.info.run_id,
            }
        )
    return pd.DataFrame(rows).sort_values(["updates", "lr", "lag", "seed"]).reset_index(drop=True)


def se(p: float) -> float:
    """The standard error the evaluation logs for accuracy ``p`` over the 500 prompts, one answer a prompt (a
    score of 1 on p·500 of them, 0 on the rest)."""
    import torch

    from rlx_cli.loops.evaluation import standard_error

    right = round(p * PROMPTS)
    return standard_error(torch.tensor([1.0] * right + [0.0] * (PROMPTS - right), dtype=torch.float64), PROMPTS)[1]


def cells(per_run: pd.DataFrame) -> pd.DataFrame:
    from rlx_cli.studies.stats import verdict

    rows = []
    for (updates, lr, lag), g in per_run.groupby(["updates", "lr", "lag"], sort=True):
        gain = g.sampled_final - g.sampled_base
        gain_se = math.sqrt(sum(se(p) ** 2 for p in [*g.sampled_final, *g.sampled_base])) / len(g)
        called = verdict(list(g.sampled_final), list(g.sampled_base), margin=0.02)
        rows.append(
            {
                "updates": updates, "lr": lr, "lag": lag, "seeds": len(g),
                "clipped_mid": g.clipped_mid.mean(), "rollout_kl": g.rollout_kl.mean(),
                "greedy_base": g.greedy_base.mean(), "greedy_final": g.greedy_final.mean(),
                "sampled_base": g.sampled_base.mean(), "sampled_final": g.sampled_final.mean(),
                "gain": gain.mean(), "gain_se": gain_se, "verdict": called.label, "p": called.p,
                "clip_acts": g.clipped_mid.mean() >= 0.01,
                "no_collapse": g.greedy_final.mean() >= g.greedy_base.mean() - 0.02,
                "learns": gain.mean() > 0 and (called.label == "better" or gain.mean() > 2 * gain_se),
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


def chosen(grid: pd.DataFrame) -> pd.Series | None:
    """The rule: the cheapest cell (updates, then lr, then lag 0 first) meeting all three tests whose lag-2 twin
    meets the first two."""
    for _, cell in grid.sort_values(["updates", "lr", "lag"]).iterrows():
        twin = grid[(grid.updates == cell.updates) & (grid.lr == cell.lr) & (grid.lag == 2)].iloc[0]
        if cell.clip_acts and cell.no_collapse and cell.learns and twin.clip_acts and twin.no_collapse:
            return cell
    return None


def markdown(grid: pd.DataFrame) -> str:
    head = "| updates | lr | lag | clipped mid-run | rollout KL | greedy base → final | sampled base → final | gain ± SE | verdict (p) | clip acts | no collapse | learns |"  # noqa: E501
    lines = [head, "|" + " --- |" * 12]
    for _, c in grid.sort_values(["updates", "lr", "lag"]).iterrows():
        yes = lambda b: "yes" if b else "no"  # noqa: E731
        lines.append(
            f"| {c.updates} | {c.lr:g} | {c.lag} | {100 * c.clipped_mid:.2f}% | {c.rollout_kl:.2g} | "
            f"{c.greedy_base:.3f} → {c.greedy_final:.3f} | {c.sampled_base:.3f} → {c.sampled_final:.3f} | "
            f"{c.gain:+.3f} ± {c.gain_se:.3f} | {c.verdict} ({c.p:.3g}) | {yes(c.clip_acts)} | {yes(c.no_collapse)} | "
            f"{yes(c.learns)} |"
        )
    return "\n".join(lines) + "\n"


def heatmap(grid: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs, updates = sorted(grid.lr.unique()), sorted(grid.updates.unique())
    fig, axes = plt.subplots(2, 2, figsize=(10, 8), constrained_layout=True)
    panels = [("clipped_mid", "clipped share of tokens, mid-run (%)", 100, "viridis"),
              ("gain", "sampled accuracy gain over the base", 1, "RdYlGn")]  # fmt: skip
    for row, lag in enumerate(sorted(grid.lag.unique())):
        for col, (key, title, scale, cmap) in enumerate(panels):
            ax = axes[row, col]
            table = grid[grid.lag == lag].pivot(index="updates", columns="lr", values=key).loc[updates, lrs] * scale
            image = ax.imshow(table.values, cmap=cmap, origin="lower", aspect="auto")
            fig.colorbar(image, ax=ax)
            for i in range(len(updates)):
                for j in range(len(lrs)):
                    cell = grid[(grid.lag == lag) & (grid.updates == updates[i]) & (grid.lr == lrs[j])].iloc[0]
                    mark = "" if cell.no_collapse else " ×"
                    ax.text(j, i, f"{table.values[i, j]:.2f}{mark}", ha="center", va="center", fontsize=9)
            ax.set_xticks(range(len(lrs)), [f"{x:g}" for x in lrs])
            ax.set_yticks(range(len(updates)), [str(u) for u in updates])
            ax.set_xlabel("trainer.lr")
            ax.set_ylabel("updates per rollout")
            ax.set_title(f"lag {lag}: {title} (× collapsed)")
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    per_run = runs()
    per_run["greedy_final_se"] = per_run.greedy_final.map(se)
    per_run["sampled_final_se"] = per_run.sampled_final.map(se)
    grid = cells(per_run)
    args.out.mkdir(parents=True, exist_ok=True)
    per_run.to_csv(args.out / "pilot-per-run.csv", index=False)
    grid.to_csv(args.out / "pilot-grid.csv", index=False)
    (args.out / "pilot-grid.md").write_text(markdown(grid))
    heatmap(grid, args.out / "pilot-heatmap.png")
    pick = chosen(grid)
    print(markdown(grid))
    print("chosen:", "none" if pick is None else f"{pick.updates} updates, lr {pick.lr:g}, lag {pick.lag}")


if __name__ == "__main__":
    main()
