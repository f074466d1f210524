"""What a run tells its user once at start-up about how it samples (the settings of a model's generation_config.json
that ``rollout=fast`` does not apply) and what its settings make of the method (a group of one without a baseline;
task=gym's question space: test_gym_task.py)."""

from __future__ import annotations

import pytest
from conftest import save_tiny_llama

from rlx_cli.config.compose import compose, job_config
from rlx_cli.loops.build import build, meaning_notes, unread_generation_settings
from rlx_cli.loops.progress import Progress


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import GenerationConfig

    path = save_tiny_llama(tmp_path_factory.mktemp("tiny"), layers=1, heads=1, head_dim=32)
    GenerationConfig(
        repetition_penalty=1.3, min_new_tokens=2, do_sample=True, temperature=0.7, eos_token_id=2
    ).save_pretrained(path)
    return path


def test_only_the_settings_rlx_does_not_set_itself_are_named(model_dir, tmp_path):
    assert unread_generation_settings(model_dir) == "min_new_tokens=2, repetition_penalty=1.3"  # temperature: rollout.*
    assert unread_generation_settings(tmp_path) == ""  # no generation_config.json
    from transformers import GenerationConfig

    GenerationConfig(output_hidden_states=False, use_cache=True, eos_token_id=2).save_pretrained(tmp_path)
    assert unread_generation_settings(tmp_path) == ""  # what the built-in bases carry: nothing that changes a draw


@pytest.mark.parametrize(("rollout", "noted"), [("fast", True), ("hf", False)])
def test_a_fast_sampler_says_once_what_it_does_not_apply(model_dir, capsys, rollout, noted):
    cfg = job_config(compose(["model=hf", f"model.path={model_dir}", f"rollout={rollout}", "trainer.threads=1"]))
    build(cfg, Progress(quiet=True))
    err = capsys.readouterr().err
    message = f"{model_dir}/generation_config.json's min_new_tokens=2, repetition_penalty=1.3 (rollout=hf does)"
    assert (message in err) is noted and err.count("generation_config.json") == int(noted)


def test_a_run_says_once_whether_the_decode_step_fuses_the_layers(model_dir, capsys):
    for finetune, path in (("full", "each layer's projections fused"), ("lora", "a projection is not a plain Linear")):
        settings = ["model=hf", f"model.path={model_dir}", f"model.finetune={finetune}", "trainer.threads=1"]
        build(job_config(compose(settings)), Progress(quiet=True))
        notes = [line for line in capsys.readouterr().err.splitlines() if "decodes with" in line]
        assert len(notes) == 1 and path in notes[0], notes


def test_a_group_of_one_under_a_group_baseline_says_once_that_it_is_reinforce_without_a_baseline(model_dir, capsys):
    settings = ["model=hf", f"model.path={model_dir}", "trainer.threads=1", "algo=grpo"]
    build(job_config(compose([*settings, "rollout.group_size=1"])), Progress(quiet=True))
    notes = [line for line in capsys.readouterr().err.splitlines() if "baseline" in line]
    assert notes == [
        "rollout.group_size=1: advantage=grpo has no other answer to compare each with, so an answer's advantage is "
        "its raw score: REINFORCE without a baseline"
    ]
    build(job_config(compose(settings)), Progress(quiet=True))
    assert "baseline" not in capsys.readouterr().err  # a group of 8
    for overrides, noted in ((["algo=rloo", "rollout.group_size=1"], True), (["algo=reinforce_pp"], False),
                             (["algo=ppo"], False), (["algo=grpo", "+ablate=no_group_sampling"], True)):  # fmt: skip
        cfg = job_config(compose(overrides))
        assert any("without a baseline" in note for note in meaning_notes(cfg, None)) is noted, overrides
