"""End to end on the tiny default: resumed SPO and RFT runs end where uninterrupted ones do (SPO's continuations
counted, RFT's answers drawn once), and a user's step verifier on a JSONL file trains GRPO with process rewards.
Every preset (grpo_process, spo, rft and online_rft among them) trains 3 steps in test_presets.py."""

from __future__ import annotations

import json
import random
import shutil
import sys

import pytest
from conftest import SHORT, rlx

from rlx_cli.loops.run import train_command

# 4 prompts x 4 answers a step, one torch thread, no MLflow: seconds a run
SMALL = [*(o for o in SHORT if o != "trainer.steps=3"), "rollout.group_size=4", "tracking=none"]
STEP_VERIFIER = '''
import re


def steps(response, answer, prompt):
    """Each a+b=c before the '#': right if b is the prompt's next term and c = a + b."""
    terms = [int(t) for t in prompt.rstrip(":").split(",")]
    found = re.finditer(r"(\\d+)\\+(\\d+)=(\\d+)", response.partition("#")[0])
    return [
        (m.end(), float(k + 1 < len(terms) and int(m[2]) == terms[k + 1] and int(m[3]) == int(m[1]) + int(m[2])))
        for k, m in enumerate(found)
    ]


def answer(response, answer):
    return float(response.rpartition("#")[2] == answer)
'''


def without_perf(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["spo", "rft"])
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(workdir, algo):
    run = [f"algo={algo}", *SMALL, "trainer.steps=4", "trainer.ckpt_every=2"]
    straight = train_command([*run, "trainer.output_dir=straight"])
    # the run as if killed after step 3: its checkpoint of step 2 (and RFT's drawn answers), nothing after
    shutil.copytree(workdir / "straight", workdir / "resumed")
    for later in ("checkpoints/step-000004", "final"):
        shutil.rmtree(workdir / "resumed" / later)
    (workdir / "resumed" / "metrics.json").unlink()
    out = rlx("train", *run, "trainer.output_dir=resumed", "trainer.resume=true", cwd=workdir)
    assert out.returncode == 0 and "resuming from resumed/checkpoints/step-000002" in out.stderr, out.stderr
    resumed = json.loads((workdir / "resumed" / "metrics.json").read_text())
    assert without_perf(resumed) == without_perf(straight)
    if algo == "spo":  # the continuations: 9 from each cutpoint, beyond the 16 answers of the step
        assert straight["train/spo_cutpoints"] > 0
        assert straight["train/spo_continuations"] == 9 * straight["train/spo_cutpoints"]
        assert straight["perf/spo_tokens"] > 0 and straight["perf/generate_s"] >= straight["perf/spo_s"]
    else:  # 4 steps x 4 prompts x 4 answers drawn once from the initial policy; the correct ones trained on
        assert straight["rft/sampled"] == 64 and 0 < straight["rft/correct"] < 64
        assert (workdir / "straight" / "rft_samples" / "samples.safetensors").is_file()


@pytest.fixture(scope="module")
def base_dir():
    """The built-in base model's directory, for model=hf (built once and cached, like every run's)."""
    from rlx_cli.config.compose import compose
    from rlx_cli.engine.base_model import ensure_base_model
    from rlx_cli.loops.build import build_task
    from rlx_cli.loops.progress import Progress

    cfg = compose([])
    return ensure_base_model(cfg.model, cfg.task, build_task(cfg.task), Progress(quiet=True))


@pytest.mark.slow
def test_a_users_step_verifier_trains_grpo_process_on_a_jsonl_file(workdir, base_dir, monkeypatch):
    rng = random.Random(0)
    terms = [[rng.randint(1, 9) for _ in range(rng.randint(2, 5))] for _ in range(40)]
    rows = [{"prompt": ",".join(map(str, t)) + ":", "answer": str(sum(t))} for t in terms]
    (workdir / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (workdir / "my_steps.py").write_text(STEP_VERIFIER)
    monkeypatch.syspath_prepend(str(workdir))
    try:
        final = train_command(
            [
                "algo=grpo_process",
                "model=hf",
                f"model.path={base_dir}",
                "task=jsonl",
                "task.path=sums.jsonl",
                "task.verifier=my_steps:answer",
                "task.step_verifier=my_steps:steps",
                *(o for o in SMALL if o != "task.eval_size=20"),
                "trainer.steps=3",
                "trainer.output_dir=out",
            ]
        )
    finally:
        sys.modules.pop("my_steps", None)
    assert final["train/reward_errors"] == 0 and final["train/steps_per_answer"] >= 1
    assert 0 < final["train/step_accuracy"] <= 1 and 0 <= final["eval/accuracy"] <= 1
