"""Step 1 of a run: compose ``conf/`` + presets + overlays + overrides with Hydra's compose API."""

from __future__ import annotations

import copy
import re
from datetime import datetime
from importlib import resources
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlx_cli.config import signatures
from rlx_cli.config.errors import UserError

CONFIG_MODULE = "rlx_cli.conf"


def conf_dir():
    return resources.files(CONFIG_MODULE)


def choice_config(group: str, choice: str) -> DictConfig:
    """One choice's YAML as shipped (``conf/<group>/<choice>.yaml``), not composed: for its own keys only."""
    return OmegaConf.create((conf_dir() / group / f"{choice}.yaml").read_text())


PLANS = "study"  # conf/study/ holds declared studies (rlx sweep --plan), not a config group


def group_choices() -> dict[str, list[str]]:
    """Every config group and its choices, e.g. ``{"algo": ["grpo", "vapo"], ...}``."""
    root = conf_dir()
    return {
        d.name: sorted(f.name[: -len(".yaml")] for f in d.iterdir() if f.name.endswith(".yaml"))
        for d in sorted(root.iterdir(), key=lambda d: d.name)
        if d.is_dir() and not d.name.startswith("_") and d.name != PLANS
    }


_PRESET: list[DictConfig] = []  # the config before the +ablate overlays, for ${preset:key} while composing
_STARTED = datetime.now()  # ${now:…} is the process's start: every compose of one command agrees


def _register_resolvers() -> None:
    resolvers = {
        "now": lambda fmt: _STARTED.strftime(fmt),
        "mul": lambda a, b: a * b,
        "preset": lambda key: OmegaConf.select(_PRESET[-1], key) if _PRESET else None,
    }
    for name, fn in resolvers.items():
        OmegaConf.register_new_resolver(name, fn, replace=True)  # replaces Hydra's clock-reading ${now:}


_COMPOSED: dict[tuple[str, ...], DictConfig] = {}  # overrides -> their config, composed once a process


def compose(overrides: list[str]) -> DictConfig:
    """The resolved config for ``overrides``; ``cfg.hydra.runtime.choices`` names the choices made.

    ``+ablate=`` overlays are composed over the preset (``algo`` plus every other override) and may refer to
    its values as ``${preset:key}``; an overlay that changes nothing the preset uses is an error.

    Composed once a process for the same overrides but ``seed=`` (``conf/`` reads no environment and never the
    seed, and ``${now:}`` is the process's start), each call getting its own copy with its own seed (as Hydra reads
    the value): planning a study composes each arm's preset, overlays and seeds again and again.
    """
    seeds = [o for o in overrides if o.startswith("seed=")]
    key = tuple(o for o in overrides if o not in seeds) if len(seeds) == 1 else tuple(overrides)
    if key not in _COMPOSED:
        _COMPOSED[key] = composed(list(key))
    cfg = copy.deepcopy(_COMPOSED[key])
    if len(key) < len(overrides):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        cfg.seed = OverridesParser.create().parse_override(seeds[0]).value()
    return cfg


def composed(overrides: list[str]) -> DictConfig:
    ablated = [o for o in overrides if o.lstrip("+").startswith("ablate=")]
    preset = compose(overrides_without(ablated, overrides)) if ablated else None
    cfg = _compose(overrides, preset)
    if preset is not None:
        names = ablations(choices_of(cfg))
        for name in names:
            single = (
                cfg
                if len(names) == 1
                else _compose([*overrides_without(ablated, overrides), f"+ablate={name}"], preset)
            )
            check_applies(name, preset, single)
    return cfg


def overrides_without(dropped: list[str], overrides: list[str]) -> list[str]:
    return [o for o in overrides if o not in dropped]


def _compose(overrides: list[str], preset: DictConfig | None = None) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    _PRESET.append(preset)
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            _register_resolvers()  # after Hydra's own set-up, which installs a clock-reading ${now:}
            cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
        for key in cfg:
            if key != "hydra" and isinstance(cfg[key], DictConfig):
                OmegaConf.resolve(cfg[key])  # ${preset:…} and ${now:…} are fixed here, once
        return cfg
    except (HydraException, OmegaConfBaseException) as error:
        raise UserError(explain(str(error), overrides)) from error
    finally:
        _PRESET.pop()


def ablations(choices: dict) -> list[str]:
    ablate = choices.get("ablate") or []
    return [ablate] if isinstance(ablate, str) else list(ablate)


def takes_a_value(cfg: DictConfig, key: str) -> bool:
    """Whether ``key`` (``group.param``) is a component hyperparameter whose default is a value, not None."""
    group, _, param = key.partition(".")
    if group not in signatures.registry().WIRING_KEYS:
        return False
    return signatures.table()[group][cfg[group].name].hyperparameters.get(param) is not None


def check_applies(name: str, preset: DictConfig, ablated: DictConfig) -> None:
    """An overlay must change a value that the preset's components use; else the arm is a silent copy."""
    from rlx_cli.config.wiring import unused_groups

    before, after = flat(job_config(preset)), flat(job_config(ablated))
    unused = unused_groups(preset)
    changed = [
        k
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k) and not k.endswith(".name") and k.split(".")[0] not in unused
    ]
    algo = choices_of(preset)["algo"]
    if not changed:
        raise UserError(f"+ablate={name} does not apply to algo={algo}: it changes nothing this preset uses")
    unset = [k for k in sorted(changed) if k in after and after[k] is None and takes_a_value(ablated, k)]
    if unset:  # CISPO under no_clip_higher: its cap would come from a lower bound it does not have
        raise UserError(f"+ablate={name} does not apply to algo={algo}: it would leave {unset[0]} unset")


def flat(cfg: DictConfig) -> dict[str, object]:
    """The resolved config as one level of dotted keys (MLflow's params)."""
    return flatten(OmegaConf.to_container(cfg, resolve=True))


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole values."""
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def explain(message: str, overrides: list[str]) -> str:
    """Hydra's multi-line error -> one line that names the key and what is valid."""
    choices = group_choices()
    missing = re.search(r"Could not find '([\w/]+?)/([^']*)'", message)
    if missing:
        group, choice = missing.groups()
        valid = choices.get(group, [])
        return f"unknown {group} '{choice}' (valid: {', '.join(valid)})"
    unknown = re.search(r"Could not (?:override|append to) '([^']+)'", message)
    if unknown:
        key = unknown.group(1)
        return f"unknown key '{key}'{valid_keys_hint(key, overrides)}"
    required = re.search(r"Missing mandatory value: ([\w.]+)", message)
    if required:
        return f"{required.group(1)} is required (set {required.group(1)}=...)"
    parse = re.search(r"Error parsing override '([^']*)'", message)
    if parse:
        return f"cannot parse override '{parse.group(1)}' (expected key=value, group=choice or +ablate=name)"
    first = next((line.strip() for line in message.splitlines() if line.strip()), message)
    return first


def valid_keys_hint(key: str, overrides: list[str]) -> str:
    """' (valid keys in trainer: ...)' from a compose without the offending override."""
    parent = key.rpartition(".")[0]
    rest = [o for o in overrides if not o.lstrip("+~").startswith(f"{key}=")]
    if len(rest) == len(overrides):
        return ""
    try:
        cfg = compose(rest)
    except UserError:
        return ""
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig):
        return ""
    keys = [k for k in node.keys() if k != "hydra"]
    name = key.rpartition(".")[2]
    if name in keys:  # the parent is one value taken from elsewhere (task=gym's task.config: ${...difficulty})
        return f" ({parent} is one value, set it whole: '{parent}={{{name}: ...}}')"
    return f" (valid keys in {parent or 'the top level'}: {', '.join(map(str, keys))})"


def choices_of(cfg: DictConfig) -> dict[str, object]:
    return OmegaConf.to_container(cfg.hydra.runtime.choices)


def job_config(cfg: DictConfig) -> DictConfig:
    """The config without Hydra's own node, as ``--cfg job`` prints it."""
    job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    OmegaConf.set_struct(job, True)
    return job
