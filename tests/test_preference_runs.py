"""algo=dpo (a pairs file, or pairs sampled from the initial policy), algo=online_dpo and a judge as the verifier
train three steps, with LoRA and fully."""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO, SHORT, save_tiny_llama

from rlx_cli.loops.run import train_command

PAIRS = REPO / "examples" / "sums_pairs.jsonl"
RUN = [*SHORT, "rollout.group_size=4", "tracking=none", "trainer.output_dir=out"]
FILE_RUN = [o for o in RUN if not o.startswith("task.eval_size=")]  # a file's held-out rows are its own


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A random tiny Llama with rlx's character tokenizer: a policy for files, or a judge."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", layers=1, heads=2, head_dim=16)


def finite(final: dict, *keys: str) -> bool:
    return all(math.isfinite(final[k]) for k in keys)


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_dpo_on_a_pairs_file(workdir, tiny_dir, finetune):
    final = train_command(
        [
            "algo=dpo",
            "model=hf",
            f"model.path={tiny_dir}",
            f"model.finetune={finetune}",
            "task=pairs",
            f"task.path={PAIRS}",
            "task.answer_field=answer",
            "rollout.max_new_tokens=8",
            *FILE_RUN,
        ]
    )
    assert finite(final, "train/loss", "train/rewards/margins", "eval/preference_accuracy", "eval/accuracy")
    assert final["train/pairs"] == 4 and final["train/skipped_steps"] == 0
    saved = {p.name for p in (workdir / "out" / "final").iterdir()}
    assert ("adapter_model.safetensors" if finetune == "lora" else "model.safetensors") in saved


@pytest.mark.slow
def test_dpo_on_the_shipped_sums_pairs_with_the_built_in_model(workdir):
    """docs/preferences.md's example: the sums file's characters are the built-in base's, so it trains on it."""
    final = train_command(["algo=dpo", "task=pairs", f"task.path={PAIRS}", *FILE_RUN])
    assert finite(final, "train/loss", "train/rewards/margins", "eval/preference_accuracy")
    assert final["train/pairs"] == 4 and final["train/skipped_steps"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_dpo_on_pairs_sampled_once_from_the_initial_policy(workdir, finetune):
    final = train_command(["algo=dpo", f"model.finetune={finetune}", "preference.pool_prompts=8", *RUN])
    assert finite(final, "train/loss", "eval/accuracy") and "eval/preference_accuracy" not in final
    rows = [json.loads(line) for line in (workdir / "out" / "pairs.jsonl").read_text().splitlines()]
    assert 0 < len(rows) <= 8 and all(r["chosen"] != r["rejected"] and r["answer"] for r in rows)


@pytest.mark.slow
def test_a_resumed_dpo_run_reads_its_sampled_pairs_back(workdir):
    run = ["algo=dpo", "preference.pool_prompts=8", *RUN, "trainer.ckpt_every=1"]
    train_command([*run[:-1], "trainer.steps=2", run[-1]])
    (workdir / "out" / "pairs.jsonl").write_text(
        json.dumps({"prompt": "3,4:", "chosen": "3+4=7#7", "rejected": "3+4=8#8", "answer": "7"}) + "\n"
    )
    final = train_command([*run, "trainer.resume=true"])  # step 3 draws from the file, not from new samples
    assert final["train/pairs"] == 4 and (workdir / "out" / "checkpoints" / "step-000003").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_online_dpo_on_the_default(workdir, finetune):
    final = train_command(["algo=online_dpo", f"model.finetune={finetune}", *RUN])
    assert finite(final, "train/reward", "eval/accuracy") and final["train/tied_groups"] <= 4
    assert final["train/pairs"] + final["train/tied_groups"] == final["train/groups"] == 4


@pytest.mark.slow
def test_online_dpo_on_a_jsonl_task(workdir, tiny_dir):
    # a random policy never answers right: operator.lt (response < answer as strings) gives groups mixed rewards
    final = train_command(
        [
            "algo=online_dpo",
            "model=hf",
            f"model.path={tiny_dir}",
            "task=jsonl",
            f"task.path={REPO / 'examples' / 'arithmetic.jsonl'}",
            "task.verifier=operator:lt",
            "rollout.max_new_tokens=8",
            *FILE_RUN,
        ]
    )
    assert finite(final, "train/reward", "train/loss") and final["train/pairs"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_grpo_with_a_tiny_judge_as_the_verifier(workdir, tiny_dir, finetune):
    judge = [
        "task.verifier=judge",
        f"task.judge.path={tiny_dir}",
        "task.judge.yes=1",
        "task.judge.no=0",
        "task.judge.template='{question}{response}={reference}:'",
        "task.judge.final_step=true",
        "task.judge.step_separator=','",
    ]
    final = train_command(["algo=grpo", f"model.finetune={finetune}", *judge, *RUN])
    assert 0 < final["train/reward"] < 1 and 0 < final["eval/accuracy"] < 1  # soft rewards: never exactly 0 or 1
    assert final["train/reward_errors"] == 0 and final["perf/score_s"] > 0
