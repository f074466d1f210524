"""One registry for every ingredient: ``group -> name -> function``.

A component is a pure function; tensors are positional, hyperparameters keyword-only with defaults
from the papers. ``conf/<group>/<name>.yaml`` holds ``name: <name>`` plus those hyperparameters and,
for some groups, *wiring keys* that tell the engine where the function plugs in (a coefficient, a
placement). ``validate`` checks a YAML block against the signature so a typo fails before a run.

``rlx_cli/config/signatures.py`` reads the same signatures from the components' source (``ast``) without importing
them (they import torch), so that ``rlx train`` refuses a bad key in a fraction of a second; ``check`` is the one check
both use, and ``check_type`` the one type check of a config value (the engine's keys' too).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_FUNCTIONS: dict[str, dict[str, Callable]] = {}
_RANGES: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
_CHOICES: dict[tuple[str, str], dict[str, tuple]] = {}
_ADVANTAGE_WEIGHTED: set[tuple[str, str]] = set()

# Keys a group's YAML may carry besides the function's hyperparameters; the engine reads them.
WIRING_KEYS: dict[str, frozenset[str]] = {
    "advantage": frozenset({"whiten", "clip"}),  # PPO-max: whiten over the batch, then clip to ±clip
    "lam_schedule": frozenset({"critic_lam"}),  # λ of the value targets; null = the policy's λ
    "kl": frozenset({"coef", "placement", "measure_every"}),  # β, "reward" (per token) or "loss"; train/kl cadence
    "lm_loss": frozenset({"coef"}),  # μ in L = L_policy + μ·L_lm
    "policy_loss": frozenset({"entropy_coef"}),  # entropy bonus: L -= entropy_coef · H
    "value_loss": frozenset({"coef"}),
    "reward_shaping": frozenset({"overlong_filter"}),  # DAPO's overlong filtering: truncated answers get no loss
    "loss_agg": frozenset(),
    "token_filter": frozenset({"normalizer"}),  # loss_agg over the "selected" tokens (authors) or "all" (TRL)
    "preference": frozenset({"pool_prompts"}),  # offline DPO without a pairs file: prompts sampled once for pairs
    "rollout_correction": frozenset(),  # importance weights for a sampler other than the trainer (policy losses)
}


# Keyword parameters the engine fills in from another group; setting them in this group's YAML is a mistake.
ENGINE_SUPPLIED: dict[str, dict[str, str]] = {
    "advantage": {"lam": "lam_schedule (lam_schedule.policy_lam, lam_schedule.alpha)"},
    "policy_loss": {"agg": "loss_agg.mode", "weights": "rollout_correction"},
    "value_loss": {"agg": "loss_agg.mode"},
    "reward_shaping": {"max_len": "rollout.max_new_tokens"},
}


class RegistryError(ValueError):
    """A config names a component or hyperparameter that does not exist or is out of range."""


def register(
    group: str,
    name: str,
    *,
    ranges: dict[str, tuple[float, float]] | None = None,
    choices: dict[str, tuple] | None = None,
    advantage_weighted: bool = False,
) -> Callable[[Callable], Callable]:
    """Register ``fn`` as ``group/name``; ``ranges`` are inclusive bounds, ``choices`` allowed values.

    ``advantage_weighted`` (policy losses): each row's loss is a multiple of its own advantages and depends on no
    other row, so a row whose advantages are all 0 adds exactly 0 to the loss and to its gradient (the update then
    skips that row's backward: ``rlx_cli/loops/update.py``)."""

    def decorate(fn: Callable) -> Callable:
        members = _FUNCTIONS.setdefault(group, {})
        if name in members:
            raise ValueError(f"{group}/{name} is registered twice ({members[name].__module__} and {fn.__module__})")
        members[name] = fn
        _RANGES[group, name] = dict(ranges or {})
        _CHOICES[group, name] = dict(choices or {})
        if advantage_weighted:
            _ADVANTAGE_WEIGHTED.add((group, name))
        return fn

    return decorate


def groups() -> list[str]:
    return sorted(_FUNCTIONS)


def names(group: str) -> list[str]:
    if group not in _FUNCTIONS:
        raise RegistryError(f"unknown component group '{group}' (valid: {', '.join(groups())})")
    return sorted(_FUNCTIONS[group])


def get(group: str, name: str) -> Callable:
    valid = names(group)
    if name not in valid:
        raise RegistryError(f"unknown {group} '{name}' (valid: {', '.join(valid)})")
    return _FUNCTIONS[group][name]


def advantage_weighted(group: str, name: str) -> bool:
    """Whether ``group/name`` was registered ``advantage_weighted`` (see ``register``)."""
    return (group, name) in _ADVANTAGE_WEIGHTED


def hyperparameters(group: str, name: str) -> dict[str, Any]:
    """The keyword-only parameters of ``group/name`` with their defaults."""
    params = inspect.signature(get(group, name)).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def split(group: str, block: dict[str, Any]) -> tuple[Callable, dict[str, Any], dict[str, Any]]:
    """A config block ``{name, **hparams, **wiring}`` -> (function, hyperparameters, wiring keys)."""
    wiring_keys = WIRING_KEYS.get(group, frozenset())
    hparams = {k: v for k, v in block.items() if k != "name" and k not in wiring_keys}
    wiring = {k: v for k, v in block.items() if k in wiring_keys}
    return get(group, block["name"]), hparams, wiring


@dataclass(frozen=True)
class Signature:
    """What a config needs to know of one registered function: its parameters' names (tensors and hyperparameters,
    in order), its keyword-only hyperparameters with their defaults (``inspect.Parameter.empty`` for none), the
    ``ranges`` and ``choices`` it was registered with, and where it is defined (``module.function``)."""

    parameters: tuple[str, ...]
    hyperparameters: dict[str, Any]
    ranges: dict[str, tuple[float, float]]
    choices: dict[str, tuple]
    source: str


Signatures = dict[str, dict[str, Signature]]  # group -> name -> Signature


def signatures() -> Signatures:
    """Every registered function's ``Signature``, from the functions themselves."""
    table: Signatures = {}
    for group in groups():
        for name in names(group):
            fn = get(group, name)
            table.setdefault(group, {})[name] = Signature(
                tuple(inspect.signature(fn).parameters), hyperparameters(group, name), _RANGES[group, name],
                _CHOICES[group, name], f"{fn.__module__}.{fn.__name__}",
            )  # fmt: skip
    return table


def validate(group: str, block: dict[str, Any]) -> None:
    """Raise ``RegistryError`` (one line naming ``group.key``) if ``block`` does not fit the signature."""
    names(group)  # an unknown group: the error lists the valid ones
    check(group, block, signatures())


def check(group: str, block: dict[str, Any], table: Signatures) -> None:
    """``validate`` against ``table`` (``signatures()``, or ``rlx_cli.config.signatures.declared()`` where the
    components are not imported)."""
    valid = sorted(table.get(group, {}))
    if "name" not in block:
        raise RegistryError(f"{group}.name is missing (valid: {', '.join(valid)})")
    name = block["name"]
    if name not in valid:
        raise RegistryError(f"unknown {group} '{name}' (valid: {', '.join(valid)})")
    signature, wiring_keys = table[group][name], WIRING_KEYS.get(group, frozenset())
    for key, value in block.items():
        if key == "name" or key in wiring_keys:
            continue
        if key in ENGINE_SUPPLIED.get(group, {}):
            raise RegistryError(f"{group}.{key} is set by {ENGINE_SUPPLIED[group][key]}, not by {group}")
        if key not in signature.hyperparameters:
            keys = sorted(set(signature.hyperparameters) | wiring_keys)
            raise RegistryError(f"{group}.{key} is not a hyperparameter of {group}/{name} (valid: {', '.join(keys)})")
        default = signature.hyperparameters[key]
        if default is not None and default is not inspect.Parameter.empty:
            check_type(f"{group}.{key}", value, (type(default),))
        low_high = signature.ranges.get(key)
        if low_high and value is not None and not low_high[0] <= value <= low_high[1]:
            raise RegistryError(f"{group}.{key}={value} is out of range (valid: {_show_range(low_high)})")
        allowed = signature.choices.get(key)
        if allowed and value not in allowed:
            raise RegistryError(f"{group}.{key}={value!r} is not valid (valid: {', '.join(map(str, allowed))})")


def check_type(key: str, value: Any, kinds: tuple[type, ...]) -> None:
    """Raise ``RegistryError`` (one line naming ``key``) unless ``value`` is None or one of ``kinds``: a bool counts
    only where ``bool`` is one of them, an int also where ``float`` is."""
    if value is None:
        return
    ok = isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool))
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise RegistryError(f"{key}={value!r} has the wrong type (valid: {' or '.join(k.__name__ for k in kinds)})")


def _show_range(low_high: tuple[float, float]) -> str:
    low, high = low_high
    if math.isinf(high):
        return f">= {low}"
    return f"{low} to {high}"
