"""Step 1 of a run: compose ``conf/`` + presets + overlays + overrides with Hydra's compose API."""

from __future__ import annotations

import re
from datetime import datetime
from importlib import resources

from omegaconf import DictConfig, OmegaConf

from rlx_cli.errors import UserError

CONFIG_MODULE = "rlx_cli.conf"


def conf_dir():
    return resources.files(CONFIG_MODULE)


def group_choices() -> dict[str, list[str]]:
    """Every config group and its choices, e.g. ``{"algo": ["grpo", "vapo"], ...}``."""
    root = conf_dir()
    return {
        d.name: sorted(f.name[: -len(".yaml")] for f in d.iterdir() if f.name.endswith(".yaml"))
        for d in sorted(root.iterdir(), key=lambda d: d.name)
        if d.is_dir() and not d.name.startswith("_")
    }


def compose(overrides: list[str]) -> DictConfig:
    """The resolved-on-access config for ``overrides``; ``cfg.hydra.runtime.choices`` names the choices."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if not OmegaConf.has_resolver("now"):
        OmegaConf.register_new_resolver("now", lambda fmt: datetime.now().strftime(fmt), use_cache=True)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            return hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise UserError(explain(str(error), overrides)) from error


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
    return f" (valid keys in {parent or 'the top level'}: {', '.join(map(str, keys))})"


def choices_of(cfg: DictConfig) -> dict[str, object]:
    return OmegaConf.to_container(cfg.hydra.runtime.choices)


def job_config(cfg: DictConfig) -> DictConfig:
    """The config without Hydra's own node, as ``--cfg job`` prints it."""
    job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    OmegaConf.set_struct(job, True)
    return job
