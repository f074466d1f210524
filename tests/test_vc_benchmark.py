"""task=shortcut_sums (answers whose length is the policy's choice) and a critic fitted like a reward model."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import SHORT, save_tiny_llama

from components.masked import last_real
from rlx_cli.sampling.tasks import Problem, SumsTask, direct, worked


def test_a_direct_answer_is_the_sum_or_off_by_one_to_nine():
    assert direct([3, 4, 5], 1.0, random.Random(0)) == "#12"
    wrong = [int(direct([3, 4, 5], 0.0, random.Random(seed))[1:]) for seed in range(200)]
    assert {abs(n - 12) for n in wrong} == set(range(1, 10))
    assert SumsTask.score("#12", Problem("3,4,5:", "12")) == 1.0  # a direct answer scores like a worked one


def test_without_direct_answers_the_sft_data_is_drawn_as_before():
    task = SumsTask(min_terms=3, max_terms=8, eval_size=1, eval_seed=0)
    before = random.Random(5)  # the stream before direct answers existed: the terms, then one worked() each
    expected = [(task.problem(t).prompt, worked(t, 0.3, before)) for t in task._draw(before, 50)]
    assert task.sft_examples(50, carry_drop=0.3, rng=random.Random(5)) == expected


def test_the_sft_mix_has_the_configured_shares():
    task = SumsTask(min_terms=3, max_terms=8, eval_size=1, eval_seed=0)
    examples = task.sft_examples(4000, carry_drop=0.0, rng=random.Random(1), direct_frac=0.5, direct_right=0.3)
    short = [(p, r) for p, r in examples if r.startswith("#")]
    assert abs(len(short) / 4000 - 0.5) < 0.03  # binomial sd 0.008
    right = sum(SumsTask.score(r, Problem(p, str(sum(map(int, p[:-1].split(",")))))) for p, r in short)
    assert abs(right / len(short) - 0.3) < 0.04
    assert all(SumsTask.score(r, Problem(p, str(sum(map(int, p[:-1].split(",")))))) for p, r in examples if "+" in r)


def test_the_critic_stages_targets_by_hand():
    """Value pretraining: the score on every token. The reward fit: the score on each answer's last token only, or,
    with an unfinished answer's score (critic.unfinished_score), that on every token before it. Padding: no target."""
    from dataclasses import replace

    from rlx_cli.loops.loop import REWARD_FIT, VALUE_PRETRAIN, fit_targets

    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    scores = torch.tensor([0.5, 2.0])
    returns, where = fit_targets(VALUE_PRETRAIN, scores, mask)
    assert torch.equal(where, mask) and torch.equal(returns, torch.tensor([[0.5, 0.5, 0.5], [2.0, 2.0, 0.0]]))
    returns, where = fit_targets(REWARD_FIT, scores, mask)
    assert torch.equal(where, torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    assert torch.equal(returns, torch.tensor([[0.0, 0.0, 0.5], [0.0, 2.0, 0.0]]))
    returns, where = fit_targets(replace(REWARD_FIT, unfinished=-1.0), scores, mask)
    assert torch.equal(where, mask) and torch.equal(returns, torch.tensor([[-1.0, -1.0, 0.5], [-1.0, 2.0, 0.0]]))


def test_last_real_marks_each_rows_last_real_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    expected = torch.tensor([[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]])
    assert torch.equal(last_real(mask), expected.bool())


@pytest.mark.parametrize("micro_batch_tokens", [8192, 48])
def test_the_reward_fit_step_learns_from_each_answers_last_token_only(tmp_path, micro_batch_tokens):
    """One critic step of the reward-model fit moves every weight by −lr·∇ of the loss written out by hand:
    0.5 · mean over the answers' last tokens of (V − score)², the other tokens' values free."""
    from rlx_cli.config.compose import compose, job_config
    from rlx_cli.loops.build import build
    from rlx_cli.loops.progress import Progress
    from rlx_cli.loops.update import value_update

    path = save_tiny_llama(tmp_path, layers=2, heads=2, head_dim=16)
    cfg = job_config(compose(["model=hf", f"model.path={path}", "algo=ppo", "critic.init=reward_model",
                              "trainer.threads=1", "trainer.grad_clip=1e9",
                              f"trainer.micro_batch_tokens={micro_batch_tokens}"]))  # fmt: skip
    parts = build(cfg, Progress(silent=True))
    critic = parts.models.critic
    parts.critic_optimizer = torch.optim.SGD(critic.trainable_parameters(), lr=1.0)
    torch.manual_seed(0)
    prompts = [f"{i % 9 + 1},{i % 7 + 2}:" for i in range(12)]
    with parts.engine.sampling():
        batch = parts.sampler.generate(parts.models.policy, prompts, temperature=1.0, max_new_tokens=10)
    if micro_batch_tokens == 48:
        assert len(parts.engine.micro_batches(batch)) > 1
    last = batch.response_mask * last_real(batch.response_mask)
    scores = (torch.arange(12) % 2).float()
    returns = scores[:, None] * last

    params = critic.trainable_parameters()
    values = critic(batch)
    by_hand = 0.5 * (((values - returns) ** 2) * last).sum() / last.sum()
    grads = torch.autograd.grad(by_hand, params)
    before = [p.detach().clone() for p in params]
    value_update(cfg, parts, batch, values.detach(), returns, "token_mean", last)
    for p, b, g in zip(params, before, grads):
        torch.testing.assert_close(p.detach() - b, -g, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "vc_ppo", "vapo", "grpo"])
def test_the_presets_train_three_steps_on_shortcut_sums(workdir, algo):
    """The study's arms on task=shortcut_sums (a base built from a short SFT here); PPO's critic fitted first."""
    from rlx_cli.loops.run import train_command

    quick_base = ["model=tiny", "model.sft.steps=30"]  # after task=: the command line picks the model
    fit = ["critic.init=reward_model", "critic.reward_fit_steps=2", "critic.unfinished_score=-1"]
    fit = fit if algo in ("ppo", "vc_ppo") else []
    final = train_command([f"algo={algo}", "task=shortcut_sums", *quick_base, *SHORT, "value_pretrain.steps=2", *fit,
                           "tracking=none", "trainer.output_dir=out"])  # fmt: skip
    assert 0.0 <= final["eval/accuracy"] <= 1.0 and final["train/response_len"] > 0
    assert (workdir / "out" / "final").is_dir()


def test_the_long_variants_answers_are_100_to_145_tokens_and_its_base_has_the_positions_for_them():
    from rlx_cli.config.compose import compose
    from rlx_cli.engine.base_model import char_llama_config, char_tokenizer
    from rlx_cli.loops.build import build_task

    cfg = compose(["task=shortcut_sums_long"])
    task = build_task(cfg.task)
    problems = task.train_problems(200, seed=0, step=0)
    terms = [[int(t) for t in p.prompt.rstrip(":").split(",")] for p in problems]
    worked_answers = [worked(t, 0.0, random.Random(0)) for t in terms]
    tokens = [len(char_tokenizer()(a, add_special_tokens=False).input_ids) + 1 for a in worked_answers]  # + EOS
    assert 100 <= min(tokens) and max(tokens) <= 145 < cfg.rollout.max_new_tokens
    longest_prompt = max(len(char_tokenizer()(p.prompt).input_ids) for p in problems)
    config = char_llama_config(dict(cfg.model.arch))
    assert config.max_position_embeddings == 256 >= longest_prompt + cfg.rollout.max_new_tokens
    assert char_llama_config({"hidden_size": 32}).max_position_embeddings == 128  # other bases keep theirs


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "vc_ppo"])
def test_the_presets_train_three_steps_on_the_long_variant(workdir, algo):
    """Answers run past the 128 positions of the other bases: generation, scoring and the critic handle them."""
    from rlx_cli.loops.run import train_command

    quick_base = ["model=tiny", "model.sft.steps=30"]
    final = train_command([f"algo={algo}", "task=shortcut_sums_long", *quick_base, *SHORT, "value_pretrain.steps=2",
                           "critic.init=reward_model", "critic.reward_fit_steps=2", "tracking=none",
                           "trainer.output_dir=out"])  # fmt: skip
    assert 0.0 <= final["eval/accuracy"] <= 1.0 and final["train/response_len"] > 0
    assert (workdir / "out" / "final").is_dir()
