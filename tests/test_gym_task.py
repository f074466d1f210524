"""task=gym: reasoning-gym's generators as a task (prompts, held-out set, the dataset's scorer, the base's data)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import mlflow_runs, rlx, rlx_together

from rlx_cli.config.errors import UserError
from rlx_cli.engine.base_model import char_tokenizer
from rlx_cli.sampling.gym_task import GymTask

pytest.importorskip("reasoning_gym")  # the dev extra installs it; the gym extra for users

TEMPLATE = "{question}\n{instruction}\n"


def gym(dataset="chain_sum", config=None, answer_format="tag", eval_size=50, template=TEMPLATE) -> GymTask:
    return GymTask(
        dataset=dataset,
        config=config or {},
        eval_size=eval_size,
        eval_seed=1234,
        template=template,
        answer_format=answer_format,
    )


def test_the_config_defaults_to_the_datasets_entry_in_the_difficulty_table():
    from rlx_cli.config.compose import compose

    one_digit = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}
    assert compose(["task=gym"]).task.config == one_digit
    assert compose(["task=gym", "task.dataset=leg_counting"]).task.config is None  # the generator's own
    assert compose(["task=gym", "task.config={max_terms: 4}"]).task.config == {"max_terms": 4}


def test_prompts_are_the_generators_questions_and_held_out_ones_are_fixed():
    import reasoning_gym

    task = gym(config={"max_terms": 3})
    entry = reasoning_gym.create_dataset("chain_sum", max_terms=3, seed=1234 + 7, size=1)[0]
    assert task.eval_problems[7].prompt == entry["question"] + "\nAnswer in <answer></answer>.\n"
    assert task.eval_problems[7].answer == entry["answer"]
    assert [p.prompt for p in gym(config={"max_terms": 3}).eval_problems] == [p.prompt for p in task.eval_problems]


def test_training_draws_replay_from_the_seed_and_never_hold_a_held_out_question():
    task = gym(config={"min_digits": 1, "max_digits": 1, "min_terms": 2, "max_terms": 2}, eval_size=60)
    held_out = {p.prompt for p in task.eval_problems}
    drawn = task.train_problems(200, seed=3, step=5)
    assert drawn == task.train_problems(200, seed=3, step=5)  # resuming replays a step's prompts
    assert drawn != task.train_problems(200, seed=3, step=6)
    assert not held_out & {p.prompt for p in drawn}  # 1-digit pairs: 100 questions, so collisions were drawn again


def test_too_small_a_space_for_held_out_and_training_prompts_is_one_line():
    task = gym(config={"min_digits": 1, "max_digits": 1, "min_terms": 2, "max_terms": 2}, eval_size=2000)
    with pytest.raises(UserError, match="too few questions"):
        task.train_problems(1, seed=0, step=0)


LEVEL00 = {"min_digits": 1, "max_digits": 1, "min_terms": 2, "max_terms": 2}  # 200 questions in all


def test_a_config_that_leaves_fewer_training_questions_than_the_run_draws_says_so_at_start_up():
    """reports/gym-chain_sum.md's level00: the 200 held-out entries take 133 of its 200 questions, 67 are left."""
    from rlx_cli.config.compose import compose, job_config
    from rlx_cli.loops.build import meaning_notes

    task = gym(config=LEVEL00, eval_size=200)
    assert task.distinct_training_questions(10_000) == 67
    assert task.distinct_training_questions(66) is None  # stops once more than enough turn up
    level00 = "task.config={min_digits: 1, max_digits: 1, min_terms: 2, max_terms: 2}"
    cfg = job_config(compose(["task=gym", level00, "trainer.steps=100", "rollout.prompts_per_step=16"]))
    assert meaning_notes(cfg, task) == [
        "task.dataset=chain_sum task.config={min_digits: 1, max_digits: 1, min_terms: 2, max_terms: 2}: 20,000 draws "
        "find 67 distinct training questions (the held-out ones excluded), fewer than the 1,600 this run draws "
        "(trainer.steps x rollout.prompts_per_step): it trains on the same questions again"
    ]
    assert meaning_notes(job_config(compose(["task=gym", level00, "trainer.steps=4"])), task) == []  # 32 draws
    default = job_config(compose(["task=gym", "trainer.steps=100", "rollout.prompts_per_step=16"]))
    assert meaning_notes(default, gym(config=dict(default.task.config), eval_size=200)) == []  # about 4,000 of them


def test_the_score_is_the_datasets_own_on_the_extracted_answer():
    task = gym(config={"max_terms": 2, "max_digits": 2})
    problem = task.eval_problems[0]
    right = problem.answer
    assert task.score(f"<answer>{right}</answer>", problem) == 1.0
    assert task.score(f"<answer>0</answer> then <answer>{right}</answer>", problem) == 1.0  # the last tag counts
    assert task.score(right, problem) == 0.0  # no tag
    assert task.score(f"<answer>{right}9</answer>", problem) == pytest.approx(len(right) / (len(right) + 1))
    plain = gym(config={"max_terms": 2, "max_digits": 2}, answer_format="plain", template="{question}{instruction}")
    assert plain.eval_problems[0].prompt == problem.entry["question"]
    assert plain.score(f"  {right}\n", plain.eval_problems[0]) == 1.0
    tagged = f"<answer>{right}</answer>"  # plain: the tags are part of the answer, partly credited as a substring
    assert plain.score(tagged, plain.eval_problems[0]) == pytest.approx(len(right) / len(tagged))


def chain_sum_of(prompt: str) -> int:
    """The true value of a chain_sum prompt's ``a + b - c =``, worked out here."""
    terms = prompt.split("problem: ")[1].split(" =")[0].split()
    return int(terms[0]) + sum(int(n) if op == "+" else -int(n) for op, n in zip(terms[1::2], terms[2::2]))


def test_the_bases_answers_carry_the_configured_defect():
    task = gym(config={"max_terms": 3, "max_digits": 2})
    clean = task.sft_examples(300, rng=random.Random(0), defect=0.0)
    assert all(response == f"<answer>{chain_sum_of(prompt)}</answer>" for prompt, response in clean)
    flawed = task.sft_examples(2000, rng=random.Random(1), defect=0.3)
    wrong = sum(response != f"<answer>{chain_sum_of(prompt)}</answer>" for prompt, response in flawed)
    assert 0.26 < wrong / 2000 < 0.31  # another problem's answer is the right one only by chance
    assert all(response.startswith("<answer>") and response.endswith("</answer>") for _, response in flawed)


def test_the_tokenizer_writes_every_character_of_prompts_and_answers():
    task = gym("leg_counting")
    tokenizer = char_tokenizer(task.chars())
    for problem in task.eval_problems[:20]:
        text = problem.prompt + task.respond(problem.answer)
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.unk_token_id not in ids[1:]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text  # newlines and spaces included


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"dataset": "chain_summ"}, "task.dataset=chain_summ is not a reasoning-gym dataset (valid: "),
        ({"config": {"max_term": 3}}, "task.config.max_term is not a setting of chain_sum (valid: min_terms,"),
        ({"config": {"min_terms": 5, "max_terms": 3}}, "is not valid for chain_sum"),
        ({"answer_format": "json"}, "task.answer_format=json is not valid (valid: tag, plain)"),
        ({"template": "{prompt}"}, "task.template='{prompt}' does not fit"),
        ({"eval_size": 0}, "task.eval_size=0 is out of range (valid: 1 to"),
    ],
)
def test_bad_settings_are_one_line(overrides, expected):
    settings = dict(dataset="chain_sum", config={}, answer_format="tag", template=TEMPLATE) | overrides
    with pytest.raises(UserError) as error:
        gym(**settings)
    assert expected in str(error.value) and "\n" not in str(error.value)


# one dataset of each family rlx's built-in base is tested on: arithmetic, counting, words
FAMILIES = {
    "arithmetic": ["task.dataset=chain_sum"],  # task.difficulty's default config
    "counting": ["task.dataset=leg_counting", "task.config={max_animals: 3}"],
    "words": ["task.dataset=spell_backward", "task.config={max_word_len: 5}", "rollout.max_new_tokens=24"],
}
QUICK_BASE = ["model.sft.steps=20", "model.sft.batch_size=16"]  # a base built in seconds (its own cache key)


def store(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory) -> dict:
    """family -> (its folder, its finished ``rlx train``): the three runs at once, one thread each, each in a folder
    and MLflow store of its own (a base is built under a lock: one process builds it, any other waits)."""
    short = ["trainer.steps=3", "trainer.eval_every=0", "rollout.prompts_per_step=4", "task.eval_size=8"]
    folders = {family: tmp_path_factory.mktemp(family) for family in FAMILIES}
    results = rlx_together(
        *[["train", "task=gym", *FAMILIES[family], *QUICK_BASE, *short, "trainer.threads=1"] for family in FAMILIES],
        cwd=list(folders.values()),
        env=[{"MLFLOW_TRACKING_URI": store(folder)} for folder in folders.values()],
    )
    return {family: (folders[family], result) for family, result in zip(FAMILIES, results)}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_three_steps(family_runs, monkeypatch, family: str):
    workdir, result = family_runs[family]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store(workdir))
    assert result.returncode == 0, result.stderr[-2000:]
    final = json.loads(next(workdir.glob("outputs/*/metrics.json")).read_text())
    assert 0.0 <= final["eval/accuracy"] <= 1.0 and final["perf/samples"] == 3 * 4 * 8
    runs = mlflow_runs(workdir)
    assert len(runs) == 1 and runs.loc[0, "status"] == "FINISHED"


def test_a_users_model_trains_on_gym_prompts(workdir: Path):
    """model=hf: no base is built; the user's tokenizer writes the prompts (here a character one of the alphabet)."""
    import torch
    from transformers import LlamaForCausalLM

    from rlx_cli.engine.base_model import char_llama_config

    chars = gym(config={"max_terms": 2, "max_digits": 1}).chars()
    arch = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, head_dim=16)
    torch.manual_seed(0)
    LlamaForCausalLM(char_llama_config(arch, max_positions=256, chars=chars)).save_pretrained(workdir / "model")
    char_tokenizer(chars).save_pretrained(workdir / "model")
    config = "task.config={max_terms: 2, max_digits: 1}"
    short = ["trainer.steps=2", "trainer.eval_every=0", "rollout.prompts_per_step=2", "task.eval_size=4"]
    home = {"RLX_HOME": str(workdir / "home")}
    result = rlx(
        "train", "task=gym", config, "model=hf", "model.path=model", *short, "tracking=none", cwd=workdir, env=home
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (workdir / "home" / "base").exists()  # a user's model: no base built
    assert json.loads(next(workdir.glob("outputs/*/metrics.json")).read_text())["perf/samples"] == 2 * 2 * 8
