"""One update per batch (1 epoch, 1 minibatch) skips the old-log-prob forward and learns exactly as before."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHORT
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlx_cli.config.compose import compose
from rlx_cli.engine.logprobs import Scorer
from rlx_cli.loops import loop
from rlx_cli.loops.build import components_of

SCORER_FORWARD = Scorer.forward
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


def train_counting_forwards(monkeypatch, overrides: list[str]) -> int:
    """``rlx train algo=grpo`` (short, one minibatch, one micro-batch a pass) with ``overrides``; -> how many
    log-prob forwards it ran."""
    from rlx_cli.loops.run import train_command

    calls = 0

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return SCORER_FORWARD(*args, **kwargs)

    monkeypatch.setattr(Scorer, "forward", counting)
    train_command([*RUN, "algo=grpo", *overrides])
    return calls


@pytest.mark.slow
def test_single_update_without_the_old_forward_learns_the_same(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    forwards = {"fast": train_counting_forwards(monkeypatch, ["trainer.output_dir=fast"])}
    monkeypatch.setattr(loop, "reuses_update_logp", lambda cfg, kl: False)  # the old path: a separate old forward
    forwards["slow"] = train_counting_forwards(monkeypatch, ["trainer.output_dir=slow"])

    steps = OmegaConf.from_dotlist(SHORT).trainer.steps
    assert forwards["slow"] - forwards["fast"] == steps  # one forward fewer per step
    fast, slow = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("fast", "slow"))
    for key in ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/reward", "eval/accuracy"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-4, abs=1e-6), key
    a, b = (load_file(tmp_path / n / "final" / "model.safetensors") for n in ("fast", "slow"))
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


@pytest.mark.parametrize(
    ("overrides", "measured"),
    [
        (["kl.measure_every=3"], [3, 6, 7]),  # KL outside the objective: every 3rd step and the last
        (["kl.measure_every=1"], [1, 2, 3, 4, 5, 6, 7]),
        (["kl=estimate", "kl.coef=0.0", "kl.measure_every=4"], [4, 7]),
        (["kl=estimate", "kl.coef=0.01", "kl.measure_every=4"], [1, 2, 3, 4, 5, 6, 7]),  # in the loss: every step
        (["kl=estimate", "kl.coef=0.01", "kl.placement=reward", "kl.measure_every=4"], [1, 2, 3, 4, 5, 6, 7]),
    ],
)
def test_which_steps_run_the_reference_forward(overrides, measured):
    kl = components_of(compose(["algo=grpo", *overrides]))["kl"]
    assert [step for step in range(1, 8) if loop.measures_kl(kl, step, last_step=7)] == measured


@pytest.mark.slow
def test_skipping_the_reference_forward_learns_the_same(tmp_path, monkeypatch):
    """kl=none: a reference forward only at the last step changes neither the weights nor the final train/kl."""
    monkeypatch.chdir(tmp_path)
    forwards = {
        every: train_counting_forwards(monkeypatch, [f"kl.measure_every={every}", f"trainer.output_dir=every{every}"])
        for every in ("1", "1000")
    }

    steps = OmegaConf.from_dotlist(SHORT).trainer.steps
    assert forwards["1"] - forwards["1000"] == steps - 1  # the last step still measures train/kl
    a, b = (json.loads((tmp_path / f"every{n}" / "metrics.json").read_text()) for n in forwards)
    assert a["train/kl"] == pytest.approx(b["train/kl"], rel=1e-5, abs=1e-7)
    a, b = (load_file(tmp_path / f"every{n}" / "final" / "model.safetensors") for n in forwards)
    assert all(torch.equal(a[k], b[k]) for k in a)
