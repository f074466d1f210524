"""registry: duplicate guard, errors that name the key and list what is valid."""

import pytest

from components import registry
from components.registry import RegistryError


@pytest.fixture
def scratch_registry(monkeypatch):
    """Register test components into copies, so the real registry is untouched."""
    monkeypatch.setattr(registry, "_FUNCTIONS", {g: dict(m) for g, m in registry._FUNCTIONS.items()})
    monkeypatch.setattr(registry, "_RANGES", dict(registry._RANGES))
    monkeypatch.setattr(registry, "_CHOICES", dict(registry._CHOICES))


def test_duplicate_registration_raises(scratch_registry):
    @registry.register("scratch", "thing")
    def thing(x, *, a=1.0):
        return x

    with pytest.raises(ValueError, match="scratch/thing is registered twice"):
        registry.register("scratch", "thing")(thing)


def test_get_lists_valid_names():
    assert registry.get("kl", "estimate").__name__ == "estimate"
    with pytest.raises(RegistryError, match=r"unknown kl 'k9' \(valid: estimate, none\)"):
        registry.get("kl", "k9")
    with pytest.raises(RegistryError, match="unknown component group 'nope'.*advantage"):
        registry.names("nope")


def test_hyperparameters_and_split():
    assert registry.hyperparameters("advantage", "gae") == {"gamma": 1.0, "lam": 0.95}
    fn, hparams, wiring = registry.split("kl", {"name": "estimate", "kind": "k2", "coef": 0.1, "placement": "loss"})
    assert fn is registry.get("kl", "estimate")
    assert hparams == {"kind": "k2"} and wiring == {"coef": 0.1, "placement": "loss"}


def test_validate_accepts_good_blocks():
    registry.validate("policy_loss", {"name": "ppo_clip", "eps_high": 0.28, "clip_ratio_c": 3, "entropy_coef": 0.0})
    registry.validate("advantage", {"name": "grpo", "norm_by_std": False, "whiten": False, "clip": None})


@pytest.mark.parametrize(
    ("group", "block", "message"),
    [
        ("kl", {"kind": "k3"}, r"kl\.name is missing \(valid: estimate, none\)"),
        ("kl", {"name": "estimate", "knd": "k3"}, r"kl\.knd is not a hyperparameter of kl/estimate \(valid: .*kind"),
        ("policy_loss", {"name": "ppo_clip", "eps_low": "0.2"}, r"policy_loss\.eps_low='0\.2' has the wrong type"),
        ("advantage", {"name": "grpo", "norm_by_std": 1}, r"advantage\.norm_by_std=1 has the wrong type"),
        ("policy_loss", {"name": "ppo_clip", "eps_low": True}, r"policy_loss\.eps_low=True has the wrong type"),
        ("policy_loss", {"name": "ppo_clip", "eps_high": 1.5}, r"policy_loss\.eps_high=1\.5 is out of range"),
        ("policy_loss", {"name": "ppo_clip", "clip_ratio_c": 0.5}, r"policy_loss\.clip_ratio_c=0\.5 .*>= 1\.0"),
        ("lam_schedule", {"name": "coupled", "policy_lam": -0.1}, r"lam_schedule\.policy_lam=-0\.1 is out of range"),
        ("loss_agg", {"name": "aggregate", "mode": "sum"}, r"loss_agg\.mode='sum' is not valid \(valid: token_mean"),
        ("kl", {"name": "estimate", "kind": "k4"}, r"kl\.kind='k4' is not valid \(valid: k1, abs, k2, k3\)"),
        ("kl", {"name": "k9"}, r"unknown kl 'k9'"),
    ],
)
def test_validate_rejects(group, block, message):
    with pytest.raises(RegistryError, match=message):
        registry.validate(group, block)
