"""Bring your own model and data: a saved-to-disk Qwen2-style model, the shipped JSONL, named verifiers."""

from __future__ import annotations

import json
import string
import sys

import pytest
from conftest import REPO, mlflow_runs, rlx_in_one_process
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlx_cli.engine.base_model import char_tokenizer
from rlx_cli.loops.run import train_command
from rlx_cli.sampling.verifiers import exact, load_verifier, math, score_all

EXAMPLE = REPO / "examples" / "arithmetic.jsonl"
FAST = [
    "trainer.steps=3",
    "trainer.eval_every=0",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "tracking=none",
    "trainer.output_dir=out",
]
CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A tiny Qwen2-style model and a character tokenizer with a chat template, saved like a user's checkpoint."""
    path = tmp_path_factory.mktemp("qwen2")
    tokenizer = char_tokenizer(string.ascii_letters + string.digits + string.punctuation + " ")
    tokenizer.chat_template = CHAT
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=len(tokenizer),
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_three_steps_from_a_saved_qwen2_and_the_example_jsonl(workdir, qwen_dir, finetune):
    final = train_command(
        [
            "model=hf",
            f"model.path={qwen_dir}",
            f"model.finetune={finetune}",
            "task=jsonl",
            f"task.path={EXAMPLE}",
            "task.verifier=math",
            *FAST,
        ]
    )
    assert 0.0 <= final["eval/accuracy"] <= 1.0 and final["train/reward_errors"] == 0
    saved = {p.name for p in (workdir / "out" / "final").iterdir()}
    assert ("adapter_model.safetensors" if finetune == "lora" else "model.safetensors") in saved


def test_verifiers_by_hand():
    assert exact("12 + 35 = 47\n#### 47", "47") == 1.0 and exact("47 or 48", "47") == 0.0
    assert math("so the answer is $\\frac{1}{2}$", "0.5") == 1.0 and math("it is 0.4", "0.5") == 0.0
    pick = load_verifier("regex", r"answer: (-?\d+)")
    assert pick("the answer: 47.", "47") == 1.0 and pick("47", "47") == 0.0


@pytest.fixture
def bad_verifiers(tmp_path, monkeypatch):
    (tmp_path / "my_verifiers.py").write_text(
        "import time\n"
        "def boom(response, answer):\n    raise ValueError('broken verifier')\n"
        "def hang(response, answer):\n    time.sleep(60)\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_verifiers", None)


def test_a_verifier_that_raises_or_hangs_scores_zero_and_is_counted(bad_verifiers):
    from my_verifiers import boom, hang

    rewards, errors = score_all(boom, [("a", "b")] * 3, timeout=1.0)
    assert rewards == [0.0] * 3 and errors == 3
    rewards, errors = score_all(hang, [("a", "b")] * 4, timeout=0.2)  # one budget for the batch, not 4 x 0.2 s
    assert rewards == [0.0] * 4 and errors == 4


def test_a_run_with_a_hanging_verifier_finishes(workdir, qwen_dir, bad_verifiers):
    final = train_command(
        [
            "model=hf",
            f"model.path={qwen_dir}",
            "task=jsonl",
            f"task.path={EXAMPLE}",
            "task.verifier=my_verifiers:hang",
            "task.verifier_timeout=0.1",
            *FAST,
        ]
    )
    assert final["train/reward"] == 0.0 and final["train/reward_errors"] > 0


BAD_DATA = {  # name: (the file's text, None for no file; more overrides; what the one line names)
    "missing": (None, [], "does not exist"),
    "empty": ("", [], "has no rows"),
    "torn": ('{"prompt": "1"', [], "cannot be read"),
    "no-field": ('{"prompt": "1", "answer": "1"}\n', ["task.answer_field=solution"], "no field 'solution'"),
}


@pytest.fixture(scope="module")
def bad_data_refused(tmp_path_factory, qwen_dir):
    """Each ``BAD_DATA`` case as ``rlx train`` runs it, in a folder and store of its own, all in one process (they
    are refused once torch is loaded): name -> (its folder, its store, its result)."""
    cases, stores = {}, {}
    for name, (content, extra, _) in BAD_DATA.items():
        folder = tmp_path_factory.mktemp(name)
        if content is not None:
            (folder / "data.jsonl").write_text(content)
        stores[name] = f"sqlite:///{folder / 'mlflow.db'}"
        args = ["train", "model=hf", f"model.path={qwen_dir}", "task=jsonl", f"task.path={folder / 'data.jsonl'}"]
        cases[name] = ([*args, *extra], folder, {"MLFLOW_TRACKING_URI": stores[name]})
    done = rlx_in_one_process(cases, tmp_path_factory.mktemp("bad-data"))
    return {name: (cases[name][1], stores[name], done[name]) for name in cases}


@pytest.mark.parametrize("name", BAD_DATA)
def test_bad_dataset_files_are_one_line_exit_2(bad_data_refused, monkeypatch, name):
    folder, store, out = bad_data_refused[name]
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "task.path" in out.stderr and BAD_DATA[name][2] in out.stderr
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    assert mlflow_runs(folder).empty


def test_example_dataset_is_well_formed():
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    assert len(rows) >= 200 and all(set(r) == {"prompt", "answer"} for r in rows)
