"""``rlx``: the command line. Each command hands its work to a module; errors for users exit with code 2."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import typer

from rlx_cli.config.compose import group_choices
from rlx_cli.config.errors import UserError


def groups_help() -> str:
    lines = [f"- **{group}**: {', '.join(choices) or '(none)'}" for group, choices in group_choices().items()]
    return "Config groups and their choices (`GROUP=CHOICE`; overlays with `+ablate=NAME`):\n\n" + "\n".join(lines)


app = typer.Typer(
    help="Declarative RL fine-tuning for language models: every ingredient a swappable Hydra component, "
    "every run tracked in MLflow.\n\n" + groups_help(),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def user_errors(command):
    """UserError -> 'error: <one line>' on stderr, exit 2; the traceback only with RLX_DEBUG=1."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as error:
            if os.environ.get("RLX_DEBUG") == "1":
                raise
            print(f"error: {error}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper


def split_cfg_flag(args: list[str]) -> tuple[list[str], str | None]:
    """Pull Hydra's ``--cfg job|all`` (or ``-c``) out of the overrides."""
    overrides, mode, it = [], None, iter(args)
    for arg in it:
        if arg in ("--cfg", "-c"):
            mode = next(it, None)
        elif arg.startswith("--cfg="):
            mode = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise UserError(f"unknown option '{arg}' (valid: --cfg job|all, --help, and key=value overrides)")
        else:
            overrides.append(arg)
    if mode is not None and mode not in ("job", "all"):
        raise UserError(f"--cfg {mode} is not valid (valid: job, all)")
    return overrides, mode


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog=groups_help(),
)
@user_errors
def train(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides: group=choice (algo=vapo), key=value (trainer.steps=50), +ablate=no_clip_higher."
    ),
) -> None:
    """Train one run on the composed config and track it in MLflow.

    Examples: rlx train · rlx train algo=vapo +ablate=no_value_pretrain seed=1 · rlx train algo=grpo --cfg job
    """
    from rlx_cli.loops.run import train_command

    overrides, print_cfg = split_cfg_flag(list(overrides or []))
    train_command(overrides, print_cfg=print_cfg)


@app.command("ls")
@user_errors
def list_components(group: str = typer.Argument(None, help="One component group, e.g. advantage.")) -> None:
    """List registered components with their hyperparameters and defaults."""
    from rlx_cli.config.listing import print_components

    print_components(group)


def only_overrides(args: list[str] | None) -> list[str]:
    """Overrides after typer took its options; anything else that looks like an option is a mistake."""
    args = list(args or [])
    for arg in args:
        if arg.startswith("-"):
            raise UserError(f"unknown option '{arg}' (see --help; overrides are key=value, sweeps key=a,b)")
    return args


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def sweep(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides with multirun sweeps: key=a,b,c · key=range(0,3) · key=choice(a,b) · seed=0,1,2."
    ),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Points that run at the same time."),
    launcher: str = typer.Option("local", "--launcher", help="local | submitit | ray (the last two: rlx[cluster])."),
    study: str = typer.Option(
        None, "--study", help="Study name (default: ALGO-sweep-HASH, stable for the same arguments)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the points and exit."),
    rerun: bool = typer.Option(False, "--rerun", help="Run points the study already FINISHED again."),
    no_report: bool = typer.Option(False, "--no-report", help="No table at the end (rlx report --study NAME --stats)."),
    plan: Path = typer.Option(
        None, "--plan", help="Run a study declared in this file (YAML: arms, baseline, metric, margin, seeds, design)."
    ),
    until_decided: bool = typer.Option(
        False, "--until-decided", help="--plan: add seeds in looks until each arm is decided (or --max-seeds)."
    ),
    max_seeds: int = typer.Option(None, "--max-seeds", help="--plan: the last look's seeds an arm (plan's, or 20)."),
    every: int = typer.Option(None, "--every", help="--plan: seeds added at each look (plan's, or 5)."),
    control: bool = typer.Option(
        None, "--control/--no-control", help="--plan: the no-op arm (+ablate=noop); on by default with --until-decided."
    ),
    runs: Path = typer.Option(
        None,
        "--runs",
        help="--plan: the earlier looks' runs, from another store (a *-runs.csv that rlx report "
        "--out wrote): they count as run; only the seeds they lack run here.",
    ),
) -> None:
    """Run every point of a grid as one `rlx train`, each an MLflow child run of the study's parent run; then print
    the study's table with verdicts and write it beside the study (table.md, table.csv). With --plan, a declared
    study: its arms, judged as declared, in looks until decided with --until-decided.

    Examples: rlx sweep algo=grpo 'loss_agg.mode=token_mean,seq_mean_token_mean' seed=0,1 --jobs 2 ·
    rlx sweep seed=0,1,2 --dry-run · rlx sweep --plan conf/study/default-short.yaml --until-decided --jobs 2
    """
    args = only_overrides(overrides)
    if plan is not None:
        from rlx_cli.studies.deciding import plan_command

        if args or study:
            raise UserError("--plan declares the whole study (valid: --plan FILE alone; put overrides in its common:)")
        raise typer.Exit(plan_command(plan, until_decided=until_decided, max_seeds=max_seeds, every=every,
                                      control=control, jobs=jobs, launcher=launcher, dry_run=dry_run, rerun=rerun,
                                      report=not no_report, runs=runs))  # fmt: skip
    only_plan = {"--until-decided": until_decided, "--max-seeds": max_seeds, "--every": every, "--control": control,
                 "--runs": runs}  # fmt: skip
    given = [name for name, value in only_plan.items() if value]
    if given:
        raise UserError(f"{given[0]} applies to a declared study (valid: rlx sweep --plan FILE {given[0]})")
    from rlx_cli.studies.sweep import sweep_command

    code = sweep_command(args, jobs=jobs, launcher=launcher, study=study, dry_run=dry_run, rerun=rerun,
                         report=not no_report)  # fmt: skip
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def ablate(
    overrides: list[str] = typer.Argument(None, help="The preset and other overrides: algo=vapo trainer.steps=50."),
    seeds: int = typer.Option(3, "--seeds", help="Seeds 0..K-1 per arm (a seed=... override replaces them)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Points that run at the same time."),
    launcher: str = typer.Option("local", "--launcher", help="local | submitit | ray (the last two: rlx[cluster])."),
    study: str = typer.Option(None, "--study", help="Study and experiment name (default: ALGO-ablation)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the points and exit."),
    rerun: bool = typer.Option(False, "--rerun", help="Run points the study already FINISHED again."),
    no_report: bool = typer.Option(False, "--no-report", help="No table at the end (rlx report --study NAME --stats)."),
) -> None:
    """The full preset plus the preset with each +ablate=no_* overlay that applies to it, K seeds each; then the
    study's table with verdicts, printed and written beside the study.

    Examples: rlx ablate algo=vapo --seeds 3 --jobs 2 · rlx ablate algo=vapo --dry-run
    """
    from rlx_cli.studies.sweep import ablate_command

    code = ablate_command(only_overrides(overrides), seeds=seeds, jobs=jobs, launcher=launcher, study=study,
                          dry_run=dry_run, rerun=rerun, report=not no_report)  # fmt: skip
    raise typer.Exit(code)


@app.command()
@user_errors
def report(
    experiment: str = typer.Option(None, "--experiment", "-e", help="MLflow experiment to read."),
    study: str = typer.Option(None, "--study", "-s", help="Study (tag rlx.study) to read, in any experiment."),
    metric: str = typer.Option(
        None, "--metric", "-m", help="The metric of the table (default eval/accuracy; with --runs the file's)."
    ),
    baseline: str = typer.Option(None, "--baseline", help="Arm for Δ (default: the first without an ablation)."),
    reduce: str = typer.Option("last", "--reduce", help="One number per run: last | max | mean_last_k | mean_first_k."),
    k: int = typer.Option(3, "--k", help="K for --reduce mean_last_k and mean_first_k."),
    fmt: str = typer.Option("md", "--format", "-f", help="md | csv | tex | html."),
    out: Path = typer.Option(None, "--out", "-o", help="Write the table to this file instead of stdout."),
    plots: Path = typer.Option(None, "--plots", help="Write PNG learning curves (mean ± std per arm) here."),
    extra_metrics: str = typer.Option(None, "--extra-metrics", help="More columns, e.g. train/reward,perf/step_s."),
    stats: bool = typer.Option(
        False,
        "--stats",
        help="Per arm: paired t-test (shared seeds) or Welch, p, Holm's p, CI of Δ, MDE at 80%, and the verdict: "
        "better | worse | equivalent (within --margin) | inconclusive (with the seeds that would decide it).",
    ),
    margin: float = typer.Option(
        None, "--margin", help="--stats: the Δ within which arms are equivalent, in the metric's units (0.02)."
    ),
    alpha: float = typer.Option(None, "--alpha", help="--stats: the family-wise level of the verdicts (0.05)."),
    lower_is_better: bool = typer.Option(
        False, "--lower-is-better", "--minimize", help="Lower is better (by default for *loss*, *kl and perf/*_s)."
    ),
    higher_is_better: bool = typer.Option(
        False, "--higher-is-better", "--maximize", help="Higher is better (the default, but for losses, KLs, times)."
    ),
    runs: Path = typer.Option(
        None, "--runs", help="Rebuild the table from a *-runs.csv that --out wrote (no MLflow store needed)."
    ),
    seeds: str = typer.Option(None, "--seeds", help="Only these seeds, e.g. 0,1,2: every arm on the same seeds."),
    arm: list[str] = typer.Option(
        None, "--arm", help="Only this arm (repeat for more): its name as printed, or overrides that single it out."
    ),
    fit: str = typer.Option(
        None,
        "--fit",
        help="entropy: per arm a, b, R² of R = -a·exp(H) + b (H train/entropy, R --metric). sigmoid: ScaleRL's "
        "R(C) per arm over --x, A, B, C_mid with intervals over seeds, Δ vs the baseline, an extrapolation check.",
    ),
    fit_from: float = typer.Option(0.0, "--fit-from", help="--fit sigmoid: fit the points at x ≥ this only."),
    power: float = typer.Option(
        None, "--power", help="Planning: instead of the table, the seeds each arm needs to detect this Δ at 80% power."
    ),
    plan_seeds: bool = typer.Option(
        False, "--plan-seeds", help="Planning from a pilot: per arm the seeds a fixed and a sequential design need."
    ),
    plan: Path = typer.Option(
        None, "--plan", help="With --runs: judge a declared study's per-run data by its plan file (looks, arms)."
    ),
    x: str = typer.Option(
        None, "--x", help="Curves over step | samples | tokens | wall: runs cut at the common budget, an AUC column."
    ),
) -> None:
    """The ablation table of tracked runs: one row per arm, mean ± std over seeds, Δ vs the baseline.

    Examples: rlx report --study vapo-ablation --stats · rlx report --study vapo-ablation --power 0.02 ·
    rlx report --runs reports/off-policy/table-runs.csv --stats --margin 0.05 ·
    rlx report --experiment rlx --format csv --out t.csv --plots curves/
    · rlx report --study entropy --fit entropy --metric eval/accuracy --plots fits/
    · rlx report --study entropy --x samples --fit sigmoid --out reports/x/fit.md --plots reports/x/
    """
    from rlx_cli.studies.report import report_command

    if lower_is_better and higher_is_better:
        raise UserError("--lower-is-better and --higher-is-better contradict each other (valid: one, or neither)")
    direction = "lower" if lower_is_better else ("higher" if higher_is_better else None)
    text = report_command(
        experiment=experiment, study=study, metric=metric, baseline=baseline, reduce_by=reduce, k=k, fmt=fmt,
        out=out, plots=plots, extra_metrics=extra_metrics, with_stats=stats, direction=direction,
        seeds=seeds, arm_names=arm, fit=fit, power=power, x=x, fit_from=fit_from, runs=runs, margin=margin, alpha=alpha,
        plan_seeds=plan_seeds, plan=plan,
    )  # fmt: skip
    if out is None:
        print(text, end="")
    else:
        print(f"wrote {out}")


@app.command()
@user_errors
def status(
    study: str = typer.Option(..., "--study", "-s", help="The study (rlx sweep/ablate --study, or its default name)."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until no point runs or waits (Ctrl-C stops)."),
    every: float = typer.Option(5.0, "--every", help="Seconds between refreshes with --watch."),
) -> None:
    """Where each point of a study stands: finished, running (step x of y), stopped, failed, pending; the time left.

    Examples: rlx status --study vapo-ablation · rlx status --study vapo-ablation --watch
    """
    from rlx_cli.studies.status import status_command

    status_command(study, watch=watch, every=every)


@app.command()
@user_errors
def ui(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Interface to bind (0.0.0.0 exposes the runs to your network)."
    ),
    port: int = typer.Option(5000, "--port", "-p", help="Port to serve on."),
) -> None:
    """Browse the tracked runs: `mlflow ui` on the current store (MLFLOW_TRACKING_URI, default sqlite:///mlflow.db).

    Examples: rlx ui · rlx ui --port 5001
    """
    from rlx_cli.loops.track import ui_command

    raise typer.Exit(ui_command(host, port))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
