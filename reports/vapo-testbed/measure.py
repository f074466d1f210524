"""The measurements of task=varied_sums' base and runs that reports/vapo-testbed.md quotes (issue 61, item 2).

    python reports/vapo-testbed/measure.py base --out reports/vapo-testbed     # the base (built first if need be)
    python reports/vapo-testbed/measure.py runs --experiment vapo-testbed --out reports/vapo-testbed
    python reports/vapo-testbed/measure.py pilot --experiment vapo-testbed-pilot   # the pilot's grid, by its rule
    python reports/vapo-testbed/measure.py gains      # from the study's table-runs.csv: the placebo against the base
    python reports/vapo-testbed/measure.py combine --later L.md --later-samples LS.md   # look 1's data + later seeds'
    # runs: the MLflow store of $MLFLOW_TRACKING_URI (default ./mlflow.db, as for rlx report)

``base``: on the task's held-out prompts (``task.eval_size``, 200), the base's greedy answer and ``--samples`` sampled
answers (T = ``rollout.temperature``, torch seed ``--seed``) to each; the prompts cut by the length of their correct
answer (worked, every carry kept, + EOS) into four quarters of equal count. Writes base-lengths.csv (min, quartiles,
max and mean of the correct, greedy and sampled answers' tokens), base-accuracy.csv (greedy and sampled accuracy with
their standard errors, overall and per quarter; the sampled answers' share of carries kept, where a step adds the
prompt's term right and crosses a multiple of ten), base-lambda.csv (the length-adaptive λ at the sampled answers'
lengths, per α) and base.md (the three as tables). Extra ``key=value`` arguments
override the config (``model.path=DIR model=hf`` measures another checkpoint).

``runs``: per run of the experiment, perf/step_s (median over its steps) and its evaluations -> runs.csv.

``gains``: from the study's per-run data (``table-runs.csv``, no MLflow store needed), each arm's greedy accuracy at
its last step minus its own at step 0 (the base's), per seed; the placebo's judged by rlx's paired test at the plan's
margin and α (a family of one: the check the plan names) -> gains.md.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import statistics
from pathlib import Path

import pandas as pd
import torch

TASK = ["task=varied_sums", "trainer.threads=1"]


def terms(prompt: str) -> list[int]:
    return [int(t) for t in re.findall(r"\d+", prompt)]


def carries(response: str, prompt: str) -> tuple[int, int]:
    """(crossings of a multiple of ten whose carry was kept, crossings) over the response's steps ``a+b=c`` that add
    the prompt's next term; ``c == a + b`` keeps the carry, ``c == a + b − 10`` drops it, any other c is not a
    carry decision and is not counted."""
    kept = seen = 0
    for k, step in enumerate(response.partition("#")[0].split(",")):
        parsed = re.fullmatch(r"(\d+)\+(\d+)=(\d+)", step)
        if not parsed or k + 1 >= len(terms(prompt)) or int(parsed[2]) != terms(prompt)[k + 1]:
            continue
        a, b, c = map(int, parsed.groups())
        if (a + b) // 10 > a // 10 and c in (a + b, a + b - 10):
            seen += 1
            kept += c == a + b
    return kept, seen


def spread(values: list[float]) -> dict[str, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"min": min(values), "q1": q1, "median": q2, "q3": q3, "max": max(values), "mean": statistics.fmean(values)}


def accuracy(scores: list[list[float]]) -> tuple[float, float]:
    """Mean over prompts of each prompt's mean score, and its (cluster) standard error, as eval/* computes them."""
    means = [sum(s) / len(s) for s in scores]
    mean = statistics.fmean(means)
    return mean, statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")


ALPHAS = (0.05, 0.1, 0.2, 0.5)  # the paper's two readings (0.05, 0.5: shared/notes/papers.md) and two between


def lam_table(lengths: list[float]) -> pd.DataFrame:
    """``lam_schedule=length_adaptive``'s λ = 1 − 1/(α·l) (the component itself) at the min, quartiles and max of
    ``lengths``, for each α of ``ALPHAS``, beside the fixed 0.95 it is ablated against."""
    from components.lam_schedule import length_adaptive

    at = spread(lengths)
    at.pop("mean")
    points = torch.tensor(list(at.values()))
    names = [f"l={k} ({v:g})" for k, v in at.items()]
    rows = [{"alpha": a, **dict(zip(names, length_adaptive(points, alpha=a).tolist()))} for a in ALPHAS]
    return pd.DataFrame(rows)


def base(args, overrides: list[str]) -> None:
    from rlx_cli.config.compose import compose
    from rlx_cli.engine.models import load_pretrained
    from rlx_cli.loops.build import build_task, built_in_base
    from rlx_cli.loops.progress import Progress
    from rlx_cli.sampling.fast_rollout import FastSampler
    from rlx_cli.sampling.tasks import worked

    cfg = compose(TASK + overrides)
    torch.set_num_threads(cfg.trainer.threads)
    task = build_task(cfg.task)
    path = cfg.model.path or built_in_base(cfg, task, Progress(quiet=True), "cpu")
    model, tokenizer = load_pretrained(path, cfg.model, torch.float32)
    sampler = FastSampler(tokenizer)
    problems = task.eval_problems
    correct = [len(worked(terms(p.prompt), 0.0, random.Random(0))) + 1 for p in problems]
    order = sorted(range(len(problems)), key=lambda i: correct[i])
    quarter = {i: 1 + rank * 4 // len(problems) for rank, i in enumerate(order)}

    def answer(temperature: float, repeats: int):
        asked = [p for p in problems for _ in range(repeats)]
        out = sampler.generate(model, [p.prompt for p in asked], temperature=temperature,
                               max_new_tokens=cfg.rollout.max_new_tokens)  # fmt: skip
        lengths = out.response_mask.sum(1).tolist()
        scores = task.score_batch(out.texts, asked)
        return out.texts, lengths, [scores[i * repeats : (i + 1) * repeats] for i in range(len(problems))]

    greedy_texts, greedy_len, greedy = answer(0.0, 1)
    torch.manual_seed(args.seed)
    sampled_texts, sampled_len, sampled = answer(cfg.rollout.temperature, args.samples)
    lengths = [
        {"answers": "correct (worked, every carry kept, + EOS)", **spread(correct)},
        {"answers": "greedy", **spread(greedy_len)},
        {"answers": f"sampled ({args.samples} a prompt)", **spread(sampled_len)},
    ]
    rows = []
    for q in (None, 1, 2, 3, 4):
        keep = [i for i in range(len(problems)) if q is None or quarter[i] == q]
        own = [correct[i] for i in keep]
        kept = [
            carries(sampled_texts[i * args.samples + j], problems[i].prompt) for i in keep for j in range(args.samples)
        ]
        rows.append(
            {
                "prompts": "all" if q is None else f"quarter {q}", "n": len(keep),
                "correct_len": f"{min(own)}-{max(own)}",
                "terms": f"{min(len(terms(problems[i].prompt)) for i in keep)}-"
                         f"{max(len(terms(problems[i].prompt)) for i in keep)}",
                **dict(zip(("greedy", "greedy_se"), accuracy([greedy[i] for i in keep]))),
                **dict(zip(("sampled", "sampled_se"), accuracy([sampled[i] for i in keep]))),
                "carry_kept": sum(k for k, _ in kept) / max(1, sum(s for _, s in kept)),
                "crossings": sum(s for _, s in kept),
            }
        )  # fmt: skip
    lams = lam_table(sampled_len)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lams.to_csv(out / "base-lambda.csv", index=False, float_format="%.4g")
    pd.DataFrame(lengths).to_csv(out / "base-lengths.csv", index=False, float_format="%.4g")
    pd.DataFrame(rows).to_csv(out / "base-accuracy.csv", index=False, float_format="%.4g")
    temperature = cfg.rollout.temperature
    note = f"Base: {path}; {len(problems)} held-out prompts; {args.samples} samples a prompt at T = {temperature}."
    (out / "base.md").write_text(
        "\n\n".join(
            [
                note,
                pd.DataFrame(lengths).to_markdown(index=False, floatfmt=".1f"),
                pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f"),
                lams.to_markdown(index=False, floatfmt=".3f"),
            ]
        )
        + "\n"
    )
    print((out / "base.md").read_text())


def runs(args) -> None:
    from rlx_cli.studies.runs import connect, histories, load_runs

    found = load_runs(args.experiment, None)
    keys = ["perf/step_s", "eval/accuracy", "eval/accuracy_sampled", "train/reward", "train/response_len"]
    logged = histories(connect()[1], found, keys)
    rows = []
    for run in found:
        params, history = run.data.params, {k: dict(logged[run.info.run_id, k]) for k in keys}
        step_s = statistics.median(history["perf/step_s"].values()) if history["perf/step_s"] else None
        row = {
            "algo": run.data.tags.get("rlx.algo"),
            "seed": int(params["seed"]),
            "steps": int(params["trainer.steps"]),
        }
        row["step_s"] = step_s
        for step in sorted(history["eval/accuracy"]):
            row[f"greedy@{step}"] = history["eval/accuracy"][step]
            row[f"sampled@{step}"] = history["eval/accuracy_sampled"][step]
        rows.append(row)
    table = pd.DataFrame(rows).sort_values(["algo", "steps", "seed"])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(args.out) / "runs.csv", index=False, float_format="%.4g")
    print(table.to_markdown(index=False, floatfmt=".3f"))


ACTED = [
    "train/clip_higher_share",
    "train/policy_lam_min",
    "train/policy_lam_max",
    "train/critic_first_token_bias",
    "train/long_quarter_weight",
    "train/groups_with_positive",
    "train/nll_share",
    "train/prompts_per_update",
]
EVALS = ["eval/accuracy", "eval/accuracy_sampled"]
DELTA = 0.02  # the rule's margin (reports/vapo-testbed.md, "The rule")


def pilot_runs(experiment: str) -> pd.DataFrame:
    """One row per FINISHED run of the pilot: cell (u2 | u8, from trainer.epochs), arm (algo, or algo-ablation),
    seed, greedy and sampled accuracy at steps 0, 20 and 40, the acted figures' means over steps 1-40 and the critic's
    mean |first-token bias| over steps 1-10."""
    from rlx_cli.studies.runs import connect, histories, load_runs

    found = load_runs(experiment, None)
    logged = histories(connect()[1], found, EVALS + ACTED)
    rows = []
    for run in found:
        tags, params = run.data.tags, run.data.params
        ablate = tags.get("rlx.ablate", "none")
        arm = tags["rlx.algo"] + ("" if ablate == "none" else f"-{ablate}")
        if arm == "vapo" and params.get("value_pretrain.steps") == "0":  # the overlays' effect as plain overrides
            arm = "vapo-no_value_pretrain"
        if arm == "vapo" and params.get("lam_schedule.critic_lam") in ("None", "null"):
            arm = "vapo-no_decoupled_gae"
        row = {"cell": "u2" if params["trainer.epochs"] == "1" else "u8", "arm": arm, "seed": int(params["seed"]),
               "minibatches": int(params["trainer.minibatches"])}  # fmt: skip
        for key, name in zip(EVALS, ("greedy", "sampled")):
            row |= {f"{name}@{step}": value for step, value in logged[run.info.run_id, key]}
        for key in ACTED:
            values = dict(logged[run.info.run_id, key])
            row[key.removeprefix("train/")] = statistics.fmean(values.values()) if values else float("nan")
        bias = [abs(v) for step, v in logged[run.info.run_id, "train/critic_first_token_bias"] if step <= 10]
        row["abs_bias_1_10"] = statistics.fmean(bias) if bias else float("nan")
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["cell", "arm", "seed"]).reset_index(drop=True)


def se(p: float, n: int = 200) -> float:
    """The evaluation's own standard error of an accuracy p on n prompts, one answer each."""
    return math.sqrt(p * (1 - p) / (n - 1))


def judge_cell(runs: pd.DataFrame) -> dict:
    """The rule of reports/vapo-testbed.md applied to one cell's runs (both seeds' means)."""
    grpo, vapo, noop = (runs[runs.arm == arm].set_index("seed") for arm in ("grpo", "vapo", "vapo-noop"))
    gain = (grpo["greedy@40"] - grpo["greedy@0"]).mean()
    gain_se = math.sqrt(sum(se(p) ** 2 for p in [*grpo["greedy@40"], *grpo["greedy@0"]])) / len(grpo)
    learns = gain > 2 * gain_se and (grpo["sampled@40"] - grpo["sampled@0"]).mean() > 0
    holds = bool(((grpo["greedy@20"] >= grpo["greedy@0"]) & (grpo["greedy@40"] >= grpo["greedy@0"])).all())
    noop_gap = (noop["greedy@40"] - vapo["greedy@40"]).abs()
    bias = {name: runs[runs.arm == f"vapo-{name}"]["abs_bias_1_10"].mean() - vapo.loc[0, "abs_bias_1_10"]
            for name in ("no_value_pretrain", "no_decoupled_gae")}  # fmt: skip
    figures = vapo.mean(numeric_only=True)
    lam_range = figures["policy_lam_max"] - figures["policy_lam_min"]
    ungrouped = 16 * 8 / figures["minibatches"]  # no group sampling: 128 prompts x 1, each update a minibatch of them
    acted = {
        "clip_higher": figures["clip_higher_share"] >= 0.01,
        "adaptive_gae": figures["policy_lam_min"] <= 0.65 and lam_range >= 0.3,
        "value_pretrain": bias["no_value_pretrain"] >= DELTA,
        "decoupled_gae": bias["no_decoupled_gae"] >= DELTA,
        "token_loss": figures["long_quarter_weight"] - 0.25 >= 0.05,
        "positive_nll": figures["groups_with_positive"] >= 0.2 and figures["nll_share"] >= 0.02,
        "group_sampling": ungrouped / figures["prompts_per_update"] >= 2,
    }
    return {
        "grpo_greedy_gain": gain, "gain_se": gain_se, "grpo_learns": learns, "grpo_holds": holds,
        "noop_gap_max": noop_gap.max(), "not_chaotic": bool((noop_gap <= DELTA).all()),
        "fit": bool(learns and holds and (noop_gap <= DELTA).all()),
        "bias_vp": bias["no_value_pretrain"], "bias_decoupled": bias["no_decoupled_gae"],
        **{k: figures[k] for k in ("clip_higher_share", "policy_lam_min", "policy_lam_max", "long_quarter_weight",
                                   "groups_with_positive", "nll_share", "prompts_per_update")},
        "ungrouped_prompts_per_update": ungrouped,
        "acting": sum(acted.values()), "not_acting": ", ".join(k for k, v in acted.items() if not v) or "-",
    }  # fmt: skip


def pilot(args) -> None:
    """The pilot's per-run figures and each cell judged by the rule -> pilot-per-run.csv, pilot-grid.csv, .md."""
    per_run = pilot_runs(args.experiment)
    grid = pd.DataFrame([{"cell": cell, **judge_cell(runs)} for cell, runs in per_run.groupby("cell")])
    fit = grid[grid.fit]
    chosen = fit.sort_values(["acting", "cell"], ascending=[False, True]).cell.iloc[0] if len(fit) else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_run.to_csv(out / "pilot-per-run.csv", index=False, float_format="%.4g")
    grid.to_csv(out / "pilot-grid.csv", index=False, float_format="%.4g")
    shown = grid.set_index("cell").map(lambda v: f"{v:.4g}" if isinstance(v, float) else v).T
    text = shown.to_markdown() + f"\n\nchosen by the rule: {chosen or 'none'}\n"
    (out / "pilot-grid.md").write_text(text)
    print(per_run.to_markdown(index=False, floatfmt=".3f"), text, sep="\n\n")


def gains(args) -> None:
    """Each arm's gain over the base, seed by seed; the placebo's verdict (vapo-testbed.md, "How it is read")."""
    from rlx_cli.studies import stats, study_plan
    from rlx_cli.studies.comparison import compare

    out = Path(args.out)
    plan = study_plan.load(out / "plan.yaml")
    runs = pd.read_csv(out / "table-runs.csv")
    runs = runs[runs.status == "FINISHED"]
    rows, verdict = [], None
    for arm, found in runs.groupby("arm", sort=False):
        end, start = (dict(zip(found.seed, found[f"eval/accuracy {at}"])) for at in ("end", "start"))
        gained = [end[s] - start[s] for s in end]
        rows.append({"arm": arm, "n": len(gained), "step 0": statistics.fmean(start.values()),
                     "last": statistics.fmean(end.values()), "gain": statistics.fmean(gained),
                     "seeds above their step 0": sum(g > 0 for g in gained)})  # fmt: skip
        if arm == "placebo":
            judging = stats.Judging(margin=plan.margin, alpha=plan.alpha)
            verdict = stats.judge({arm: (compare(end, start, margin=plan.margin), 0)}, judging)[arm]
    table = pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f")
    said = "no placebo runs" if verdict is None else (
        f"placebo against its own step 0 (the base), paired over {len(verdict.comparison.arm)} seeds: "
        f"{verdict.label}, Δ {verdict.delta:+.3f}, {verdict.level:.0%} interval [{verdict.low:+.3f}, "
        f"{verdict.high:+.3f}], p {verdict.p:.3g}, δ = {plan.margin}, α = {plan.alpha}")  # fmt: skip
    text = f"{table}\n\n{said}\n"
    (out / "gains.md").write_text(text)
    print(text)


def combine(args) -> None:
    """The study's per-run data over its looks (vapo-testbed.md, "Where it stands"): look 1's as committed
    (``table-look1-*``, ``table-samples-look1-*``) and the later seeds' as ``rlx report --out`` wrote them from the
    store that ran them (``--later T.md`` at steps, ``--later-samples T.md`` with ``--x samples``), their arms named
    as the plan names them (a plain sweep's labels, ``vapo +ablate=X``, renamed) -> table-runs.csv, table-curves.csv,
    table-samples-runs.csv, table-samples-curves.csv; the samples' curves gain each run's ``AUC of eval/accuracy``
    (``compute_axis.area``) as a one-point curve."""
    from rlx_cli.studies import compute_axis, study_plan
    from rlx_cli.studies.arms import ablation_of
    from rlx_cli.studies.study import override_tokens

    out = Path(args.out)
    plan = study_plan.load(out / "plan.yaml")
    named = {ablation_of(words): name for name, words in plan.arms.items()}
    for table, later in (("table", args.later), ("table-samples", args.later_samples)):
        earlier, later = out / f"{table}-look1", Path(later).with_suffix("")
        parts = {}
        for kind in ("runs", "curves"):
            old, new = (pd.read_csv(f"{stem}-{kind}.csv", dtype={"seed": str}) for stem in (earlier, later))
            new["arm"] = [a if a in plan.arms else named[ablation_of(override_tokens(a))] for a in new.arm]
            clash = set(zip(old.arm, old.seed)) & set(zip(new.arm, new.seed))
            if clash:
                raise SystemExit(f"{later}-{kind}.csv repeats look 1's runs {sorted(clash)}: export only the new seeds")
            parts[kind] = pd.concat([old, new], ignore_index=True)
        curves = parts["curves"]
        if table == "table-samples":
            accuracy = curves[curves.metric == "eval/accuracy"]
            areas = [
                {"arm": arm, "seed": seed, "run_id": run, "metric": "AUC of eval/accuracy", "x": 0,
                 "value": compute_axis.area(list(zip(found.x, found.value)))}
                for (arm, seed, run), found in accuracy.groupby(["arm", "seed", "run_id"], sort=False)
            ]  # fmt: skip
            curves = pd.concat([curves, pd.DataFrame(areas)], ignore_index=True)
        parts["runs"].to_csv(out / f"{table}-runs.csv", index=False)
        curves.to_csv(out / f"{table}-curves.csv", index=False)
        print(f"{table}: {len(parts['runs'])} runs, {len(parts['runs']) - len(pd.read_csv(f'{earlier}-runs.csv'))} new")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["base", "runs", "pilot", "gains", "combine"])
    parser.add_argument("--later", help="combine: the later seeds' table as rlx report --out wrote it")
    parser.add_argument("--later-samples", help="combine: the same with --x samples")
    parser.add_argument("--out", default="reports/vapo-testbed")
    parser.add_argument("--samples", type=int, default=4, help="sampled answers per held-out prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--experiment", default="vapo-testbed")
    args, overrides = parser.parse_known_args()
    {
        "base": lambda: base(args, overrides),
        "runs": lambda: runs(args),
        "pilot": lambda: pilot(args),
        "gains": lambda: gains(args),
        "combine": lambda: combine(args),
    }[args.what]()


if __name__ == "__main__":
    main()
