"""Every algo preset composes, validates and trains; every ablation overlay changes exactly its own keys."""

from __future__ import annotations

import functools
import importlib
import math

import pytest
from conftest import SHORT, undocumented_metrics

from rlx_cli.config.compose import compose, flat, group_choices, job_config
from rlx_cli.config.errors import UserError
from rlx_cli.config.validate import validate

ALGOS = group_choices()["algo"]
OFF_POLICY = {"gspo", "cispo", "sapo", "gmpo"}  # trained with LoRA too
# what each overlay may change, relative to the preset it is applied to (lam_schedule.alpha disappears and
# lam_schedule.policy_lam appears when no_adaptive_gae swaps the length-adaptive schedule for a fixed λ)
OVERLAY_KEYS = {
    "no_value_pretrain": {"value_pretrain.steps"},
    "no_decoupled_gae": {"lam_schedule.critic_lam"},
    "no_adaptive_gae": {"lam_schedule.name", "lam_schedule.alpha", "lam_schedule.policy_lam"},
    "no_clip_higher": {"policy_loss.eps_high"},
    "no_token_loss": {"loss_agg.mode"},
    "no_positive_nll": {"lm_loss.coef"},
    "no_group_sampling": {"rollout.group_size", "rollout.prompts_per_step"},
    "noop": {"trainer.loss_scale"},  # the no-op control: the loss times 1 + 2^-20, a different rounding only
    "placebo_reward": {"trainer.placebo_reward"},  # the placebo control: the draw's scores by lot
}


def test_the_expected_presets_and_overlays_exist():
    expected = {"ppo", "vc_ppo", "vapo", "grpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo_max"}
    assert expected | {"clip_cov", "kl_cov", "forking_tokens"} | OFF_POLICY <= set(ALGOS)
    assert set(group_choices()["ablate"]) == set(OVERLAY_KEYS)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_validates(algo):
    validate(compose([f"algo={algo}"]))


def test_every_training_loop_validate_accepts_is_a_module_that_trains():
    """``trainer.loop``'s valid names (config/choices.py, checked without importing a loop) are loops/run.py's LOOPS,
    each a module with its ``train``."""
    from rlx_cli.config.choices import TRAINING_LOOPS
    from rlx_cli.loops.run import LOOPS

    assert tuple(LOOPS) == TRAINING_LOOPS
    assert all(callable(importlib.import_module(module).train) for module in LOOPS.values())


@functools.cache
def preset_of(algo: str) -> dict:
    return flat(job_config(compose([f"algo={algo}"])))


def changed_keys(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


@pytest.mark.parametrize("ablate", sorted(OVERLAY_KEYS))
@pytest.mark.parametrize("algo", ALGOS)
def test_each_overlay_changes_exactly_its_keys_or_refuses(algo, ablate):
    preset = preset_of(algo)
    try:
        cfg = compose([f"algo={algo}", f"+ablate={ablate}"])
    except UserError as error:
        assert f"+ablate={ablate} does not apply to algo={algo}" in str(error)
        return
    if ablate == "placebo_reward" and algo in ("dpo", "spo", "grpo_process"):  # pairs, step or cut rewards: no draw's
        with pytest.raises(UserError, match="trainer.placebo_reward=true"):  # scores to hand out by lot
            validate(cfg)
        return
    if ablate == "no_group_sampling" and cfg.trainer.loop in ("dpo", "online_dpo"):  # best vs worst of one answer
        with pytest.raises(UserError, match="rollout.group_size=1"):  # refused (rlx ablate: applicable_overlays)
            validate(cfg)
        return
    validate(cfg)
    changed = changed_keys(preset, flat(job_config(cfg)))
    assert changed and changed <= OVERLAY_KEYS[ablate], changed


@pytest.mark.parametrize("ablate", sorted(OVERLAY_KEYS))
def test_every_overlay_applies_to_vapo(ablate):
    preset = preset_of("vapo")
    changed = changed_keys(preset, flat(job_config(compose(["algo=vapo", f"+ablate={ablate}"]))))
    assert changed == OVERLAY_KEYS[ablate]


def test_overlays_compose_with_each_other_and_keep_samples_per_step():
    cfg = compose(["algo=vapo", "+ablate=[no_group_sampling,no_clip_higher,no_adaptive_gae]"])
    assert cfg.rollout.group_size == 1 and cfg.rollout.prompts_per_step == 16 * 8
    assert cfg.policy_loss.eps_high == cfg.policy_loss.eps_low == 0.2
    assert cfg.lam_schedule.name == "decoupled" and cfg.lam_schedule.critic_lam == 1.0


def test_an_overlay_that_does_not_apply_is_refused():
    refused = [("grpo", "no_value_pretrain"), ("ppo", "no_clip_higher"), ("grpo", "no_adaptive_gae")]
    refused += [("clip_cov", "no_clip_higher"), ("kl_cov", "no_clip_higher")]  # ε_low = ε_high = 1; no clip at all
    for algo, ablate in refused:
        with pytest.raises(UserError, match=f"ablate={ablate} does not apply to algo={algo}"):
            compose([f"algo={algo}", f"+ablate={ablate}"])


def logged_metrics(monkeypatch) -> set[str]:
    """Every metric name a run started from here on logs at any step (``tracking=none``'s tracker, recorded)."""
    from rlx_cli.loops.track import NullTracker

    names = set()
    monkeypatch.setattr(NullTracker, "log_metrics", lambda self, metrics, step: names.update(metrics))
    return names


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_trains_three_steps(workdir, monkeypatch, algo):
    from rlx_cli.loops.run import train_command

    fit = ["critic.init=reward_model", "critic.reward_fit_steps=1"] if algo == "ppo" else []  # reward_fit/* too
    logged = logged_metrics(monkeypatch)
    final = train_command([f"algo={algo}", *SHORT, "value_pretrain.steps=2", *fit, "tracking=none",
                           "trainer.output_dir=out"])  # fmt: skip
    assert 0.0 <= final["eval/accuracy"] <= 1.0 and final["train/response_len"] > 0
    assert (workdir / "out" / "final").is_dir()
    assert not undocumented_metrics(sorted(logged | set(final))), "metrics missing from docs/metrics.md"
    if algo == "vapo":  # each ingredient's "did it act" figure (docs/metrics.md), in its range
        assert 0 <= final["train/nll_share"] < 1 and 0 <= final["train/groups_with_positive"] <= 1
        assert (final["train/nll_share"] > 0) == (final["train/groups_with_positive"] > 0)  # on where a row scored
        assert final["train/policy_lam_min"] < final["train/policy_lam_max"] <= 1  # length-adaptive: λ per row
        assert 0 < final["train/long_quarter_weight"] < 1 and final["train/prompts_per_update"] <= 4
        assert math.isfinite(final["train/critic_first_token_bias"]) and "train/clip_higher_share" in final
    if algo == "ppo":  # the check saw the critic fits' metrics, logged before the first step and not in `final`
        assert {"reward_fit/value_loss", "value_pretrain/value_loss"} <= logged - set(final)


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(OFF_POLICY))
def test_the_off_policy_presets_train_three_steps_with_lora(workdir, algo):
    from rlx_cli.loops.run import train_command

    final = train_command([f"algo={algo}", *SHORT, "model.finetune=lora", "tracking=none", "trainer.output_dir=out"])
    assert 0.0 <= final["eval/accuracy"] <= 1.0 and final["train/response_len"] > 0
    assert "train/approx_kl" in final and (workdir / "out" / "final").is_dir()
