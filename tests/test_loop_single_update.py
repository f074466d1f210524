"""One update per batch (1 epoch, 1 minibatch) skips the old-log-prob forward and learns exactly as before."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHORT
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlx_cli import loop
from rlx_cli.build import components_of
from rlx_cli.compose import compose

RUN = [*SHORT, "rollout.group_size=4", "trainer.minibatches=1", "trainer.ckpt_every=0", "tracking=none"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["trainer.minibatches=1"], True),
        (["trainer.minibatches=2"], False),  # the second minibatch sees an updated policy
        (["trainer.minibatches=1", "trainer.epochs=2"], False),
        (["trainer.minibatches=1", "kl=estimate", "kl.coef=0.01", "kl.placement=reward"], False),
        (["trainer.minibatches=1", "kl=estimate", "kl.coef=0.01", "kl.placement=loss"], True),
        (["trainer.minibatches=1", "kl=estimate", "kl.coef=0.0", "kl.placement=reward"], True),
    ],
)
def test_when_the_update_supplies_the_old_log_probs(overrides, expected):
    cfg = compose(["algo=grpo", *overrides])
    assert loop.reuses_update_logp(cfg, components_of(cfg)["kl"]) is expected


@pytest.mark.slow
def test_single_update_without_the_old_forward_learns_the_same(tmp_path, monkeypatch):
    from rlx_cli.run import train_command

    monkeypatch.chdir(tmp_path)
    forwards = {"fast": 0, "slow": 0}
    response_logp = loop.response_logp
    for name in ("fast", "slow"):

        def counting(*args, _name=name, **kwargs):
            forwards[_name] += 1
            return response_logp(*args, **kwargs)

        monkeypatch.setattr(loop, "response_logp", counting)
        if name == "slow":  # the old path: a separate no-grad forward for the old log-probs
            monkeypatch.setattr(loop, "reuses_update_logp", lambda cfg, kl: False)
        train_command([*RUN, "algo=grpo", f"trainer.output_dir={name}"])

    steps = OmegaConf.from_dotlist(SHORT).trainer.steps
    assert forwards["slow"] - forwards["fast"] == steps  # one forward fewer per step
    fast, slow = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("fast", "slow"))
    for key in ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/reward", "eval/accuracy"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-4, abs=1e-6), key
    a, b = (load_file(tmp_path / n / "final" / "model.safetensors") for n in ("fast", "slow"))
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)
