"""The points of a grid: Hydra's multirun syntax expanded, and the ``+ablate=`` overlays that apply to a preset."""

from __future__ import annotations

from rlx_cli.config.compose import CONFIG_MODULE, compose, explain, group_choices
from rlx_cli.config.errors import UserError

CONTROLS = ("noop", "placebo_reward")  # overlays in conf/ablate/ that are controls, not ingredients: rlx ablate skips


def expand(args: list[str]) -> list[list[str]]:
    """Hydra multirun expansion: ``["a=1,2", "b=x"]`` -> ``[["a=1", "b=x"], ["a=2", "b=x"]]``."""
    from hydra import initialize_config_module
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
            (points,) = BasicSweeper.split_arguments(parser.parse_overrides(list(args)), None)
    except OverrideParseException as error:
        first = str(error).splitlines()[0]
        raise UserError(f"cannot parse override '{error.override}': {first} (sweeps: key=a,b · range())") from None
    except HydraException as error:
        if "does not support sweep type" in str(error):
            valid = "a,b,c · range() · choice() · glob()"
            raise UserError(f"interval() cannot be enumerated (valid sweeps: {valid})") from None
        raise UserError(explain(str(error), list(args))) from None
    finally:
        GlobalHydra.instance().clear()
    return points


def applicable_overlays(base: list[str]) -> list[str]:
    """The ``conf/ablate/`` overlays that compose and validate on top of ``base``."""
    from rlx_cli.config.validate import validate

    names = []
    for name in [n for n in group_choices().get("ablate", []) if n not in CONTROLS]:
        try:
            validate(compose([*base, f"+ablate={name}"]))
        except UserError:
            continue
        names.append(name)
    return names
