"""One name in four places: conf/<group>/<name>.yaml ↔ name: ↔ @register(group, name) ↔ the function."""

import inspect
from pathlib import Path

import pytest
import yaml

from components import registry

CONF = Path(__file__).parents[1] / "conf"
GROUPS = sorted(registry.WIRING_KEYS)
# the engine dispatches advantage inputs by parameter name
ADVANTAGE_INPUTS = {"token_rewards", "values", "mask", "scores", "group_index"}
# and the rollout stages' annotations (rlx_cli/sampling/credit.py)
ADVANTAGE_INPUTS |= {"step_rewards", "step_ends", "cut_values", "cuts", "token_probs"}


def yamls(group):
    return sorted((CONF / group).glob("*.yaml"))


def block(path):
    return yaml.safe_load(path.read_text())


ALL = [pytest.param(g, p, id=f"{g}/{p.stem}") for g in GROUPS for p in yamls(g)]


def test_every_component_group_has_yamls():
    for group in GROUPS:
        assert yamls(group), f"conf/{group}/ has no YAML"


# named settings: a choice that is a registered component with other values (conf/<group>/<setting>.yaml, its
# `name:` the component's). A preset's body cannot hold them: an overlay that swaps the group (no_adaptive_gae) would
# leave the body's keys behind on the new component. file -> its component
SETTINGS = {("lam_schedule", "length_adaptive_long"): "length_adaptive"}


@pytest.mark.parametrize("group", GROUPS)
def test_yaml_files_and_registry_agree(group):
    settings = {stem for g, stem in SETTINGS if g == group}
    assert {p.stem for p in yamls(group)} - settings == set(registry.names(group))


@pytest.mark.parametrize(("group", "path"), ALL)
def test_yaml_matches_function(group, path):
    conf = block(path)
    assert conf["name"] == SETTINGS.get((group, path.stem), path.stem)
    defaults = registry.hyperparameters(group, conf["name"])
    wiring = registry.WIRING_KEYS[group]
    for key, value in conf.items():
        if key == "name" or key in wiring:
            continue
        assert key in defaults, f"{path}: {key} is neither a keyword-only parameter nor a wiring key"
        if (group, path.stem) not in SETTINGS:  # a component's own file holds its function's defaults
            assert value == defaults[key], f"{path}: {key}={value!r} but the function default is {defaults[key]!r}"
    missing = set(defaults) - set(conf) - set(registry.ENGINE_SUPPLIED.get(group, {}))  # the engine passes these
    assert not missing, f"{path} leaves out {missing}"
    registry.validate(group, conf)


@pytest.mark.parametrize(("group", "path"), ALL)
def test_wiring_keys_are_present_and_sane(group, path):
    conf = block(path)
    assert registry.WIRING_KEYS[group] <= set(conf), f"{path} lacks a wiring key"
    if group == "kl":
        assert conf["placement"] in {"reward", "loss"}
        assert conf["coef"] >= 0
    if group == "advantage":
        assert isinstance(conf["whiten"], bool) and (conf["clip"] is None or conf["clip"] > 0)
    if group == "lam_schedule":
        assert conf["critic_lam"] is None or 0 <= conf["critic_lam"] <= 1
    if group == "token_filter":
        assert conf["normalizer"] in {"selected", "all"}


@pytest.mark.parametrize(("group", "name"), [(g, n) for g in GROUPS for n in registry.names(g)])
def test_signatures(group, name):
    fn = registry.get(group, name)
    params = inspect.signature(fn).parameters.values()
    keyword = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert all(p.default is not inspect.Parameter.empty for p in params if p.name in keyword)
    assert set(registry._RANGES[group, name]) <= keyword and set(registry._CHOICES[group, name]) <= keyword
    assert fn.__doc__, f"{group}/{name} has no docstring"
    if group == "advantage":
        assert set(positional) <= ADVANTAGE_INPUTS and "mask" in positional
    # the function's own defaults pass its ranges and choices (keys the engine fills in are not the YAML's)
    supplied = registry.ENGINE_SUPPLIED.get(group, {})
    defaults = {k: v for k, v in registry.hyperparameters(group, name).items() if k not in supplied}
    registry.validate(group, {"name": name, **defaults})
