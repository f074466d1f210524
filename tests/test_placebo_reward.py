"""``trainer.placebo_reward`` (``+ablate=placebo_reward``): a control whose training scores are the draw's own scores
handed out by lot (evaluation, in ``loops/evaluation.py``, scores its own answers by the verifier)."""

from __future__ import annotations

import pytest
from conftest import SHORT

from rlx_cli.config.compose import compose
from rlx_cli.config.errors import UserError
from rlx_cli.config.validate import validate


def one_step(monkeypatch, overrides: list[str]) -> tuple[list[str], list[float], list, dict]:
    """One RL step of ``overrides`` in this process -> (its answers, the scores training saw, their problems, the
    run's final metrics)."""
    from rlx_cli.loops import groups, loop
    from rlx_cli.loops.run import train_command

    drawn, answers, sample = [], groups.answers, groups.sample_groups

    def kept_answers(cfg, parts, rows, temperature, model=None):
        batch = answers(cfg, parts, rows, temperature, model)
        drawn.extend([batch.texts, rows])
        return batch

    def kept_scores(*args, **kwargs):
        batch, scores, *rest = sample(*args, **kwargs)
        drawn.append(scores.tolist())
        return (batch, scores, *rest)

    monkeypatch.setattr(groups, "answers", kept_answers)
    monkeypatch.setattr(loop, "sample_groups", kept_scores)
    out = f"out-{len(overrides)}"
    final = train_command([*SHORT, "trainer.steps=1", "tracking=none", f"trainer.output_dir={out}", *overrides])
    texts, rows, scores = drawn  # one draw: the step's (no critic, no dynamic sampling)
    return texts, scores, rows, final


@pytest.mark.slow
def test_a_placebo_reward_is_the_draws_scores_by_lot(workdir, monkeypatch):
    from rlx_cli.loops.build import build_task

    plain_texts, plain_scores, _, plain_final = one_step(monkeypatch, [])
    texts, scores, rows, final = one_step(monkeypatch, ["+ablate=placebo_reward"])
    assert texts == plain_texts  # the same answers: the step's sampling does not see the lottery
    truth = build_task(compose(SHORT).task).score_batch(texts, rows)  # the verifier's own scores
    assert plain_scores == truth and 0 < sum(truth) < len(truth)  # right and wrong answers both, on the default base
    assert sorted(scores) == sorted(truth) and scores != truth  # the same scores, not to the same answers
    assert final["train/reward"] == plain_final["train/reward"]  # so the same mean reward


@pytest.mark.parametrize(
    ("algo", "what"),
    [
        ("dpo", "trainer.loop=dpo's pairs"),
        ("spo", "advantage=spo_chain's cut_values"),
        ("grpo_process", "advantage=grpo_process's step_rewards"),
    ],  # fmt: skip
)
def test_a_placebo_reward_is_refused_where_scores_are_not_a_draws(algo, what):
    refused = f"^trainer.placebo_reward=true hands a sampled draw's scores out by lot, not {what} "
    with pytest.raises(UserError, match=refused):
        validate(compose([f"algo={algo}", "+ablate=placebo_reward"]))
