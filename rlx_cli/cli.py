"""``rlx``: the command line. Each command hands its work to a module; errors for users exit with code 2."""

from __future__ import annotations

import functools
import os
import sys

import typer

from rlx_cli.compose import group_choices
from rlx_cli.errors import UserError


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
    from rlx_cli.run import train_command

    overrides, print_cfg = split_cfg_flag(list(overrides or []))
    train_command(overrides, print_cfg=print_cfg)


@app.command("ls")
@user_errors
def list_components(group: str = typer.Argument(None, help="One component group, e.g. advantage.")) -> None:
    """List registered components with their hyperparameters and defaults."""
    from rlx_cli.listing import print_components

    print_components(group)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
