"""Evaluation's own noise: standard errors over prompts (cluster SE with several answers a prompt), and common random
numbers: runs with equal weights sample equal evaluations, whatever they drew before, a block of prompts at a time."""

from __future__ import annotations

import math

import pytest
import torch

from rlx_cli.config.compose import compose
from rlx_cli.loops import evaluation
from rlx_cli.loops.build import build
from rlx_cli.loops.progress import Progress


def test_standard_error_over_prompts_by_hand():
    # greedy, one answer a prompt: mean 0.75, SE = sqrt((3 · 0.25² + 0.75²) / (4 · 3)) = sqrt(0.0625) = 0.25
    assert evaluation.standard_error(torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64), 4) == (0.75, 0.25)
    # two answers a prompt, [[1, 1], [0, 1], [0, 0]]: the prompts' means 1, 0.5, 0 are the clusters' values;
    # SE = sqrt((0.5² + 0 + 0.5²) / (3 · 2)) = sqrt(1 / 12), not the 0.204 = sqrt(p(1 - p) / 6) of six lone answers
    scores = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    mean, se = evaluation.standard_error(scores.mean(1), 3)
    assert mean == 0.5 and se == pytest.approx(math.sqrt(1 / 12), abs=1e-15)
    assert math.isnan(evaluation.standard_error(torch.tensor([1.0], dtype=torch.float64), 1)[1])


def parts_of(rollout: str, *overrides: str):
    cfg = compose([f"rollout={rollout}", "task.eval_size=40", "eval.samples=3", "tracking=none", "trainer.threads=1",
                   *overrides])  # fmt: skip
    return cfg, build(cfg, Progress(quiet=True))


@pytest.mark.parametrize("rollout", ["fast", "hf"])
def test_arms_with_equal_weights_sample_equal_evaluations(rollout, monkeypatch):
    """Two arms of a study (another clip range: the same weights at step 0), one having drawn other random numbers
    before: their sampled evaluations are equal answer for answer; a block's draws do not depend on the others'."""
    cfg, parts = parts_of(rollout)
    other_cfg, other = parts_of(rollout, "policy_loss.eps_high=0.28")
    drawn = []
    monkeypatch.setattr(evaluation, "scored", lambda *a: drawn.append(SCORED(*a)) or drawn[-1])
    first = evaluation.evaluate(cfg, parts)
    torch.rand(1000)  # training drew other numbers in this arm
    second = evaluation.evaluate(other_cfg, other)
    assert first == second and 0 < first["eval/accuracy_sampled"] < 1
    assert first["eval/accuracy_sampled_se"] > 0 and first["eval/accuracy_se"] >= 0
    blocks = [scores for scores, _ in drawn[1:4]]  # the first evaluation's sampled blocks: 16, 16, 8 prompts
    assert [len(b) for b in blocks] == [16, 16, 8]
    assert torch.cat(blocks).mean().item() == pytest.approx(first["eval/accuracy_sampled"], abs=1e-12)
    # the first block's answers now draw 123 numbers more (as longer answers would): the other blocks draw as before
    first_prompt = parts.task.eval_problems[0]

    def longer(cfg, parts, problems, temperature, **kwargs):
        batch = ANSWERS(cfg, parts, problems, temperature, **kwargs)
        if temperature > 0 and problems[0] is first_prompt:
            torch.rand(123)
        return batch

    monkeypatch.setattr(evaluation, "answers", longer)
    drawn.clear()
    evaluation.evaluate(cfg, parts)
    assert torch.equal(drawn[2][0], blocks[1]) and torch.equal(drawn[3][0], blocks[2])


def test_the_long_and_short_halves_split_the_held_out_prompts_by_length(monkeypatch):
    """eval/*_long_half and *_short_half: the same answers' scores, averaged over each half of the 40 held-out prompts
    cut by their length (characters), checked against a split by torch's stable sort."""
    cfg, parts = parts_of("fast")
    drawn = []
    monkeypatch.setattr(evaluation, "scored", lambda *a: drawn.append(SCORED(*a)) or drawn[-1])
    out = evaluation.evaluate(cfg, parts)
    lengths = torch.tensor([len(p.prompt) for p in parts.task.eval_problems])
    longer = torch.zeros(len(lengths), dtype=torch.bool)
    longer[torch.sort(lengths, stable=True).indices[len(lengths) // 2 :]] = True
    assert len(lengths) == 40 and lengths[longer].min() >= lengths[~longer].max() > lengths.min()
    greedy, sampled = drawn[0][0].mean(1), torch.cat([scores for scores, _ in drawn[1:]]).mean(1)
    for name, scores in (("accuracy", greedy), ("accuracy_sampled", sampled)):
        assert out[f"eval/{name}_long_half"] == pytest.approx(scores[longer].mean().item(), abs=1e-12)
        assert out[f"eval/{name}_short_half"] == pytest.approx(scores[~longer].mean().item(), abs=1e-12)
        halves = (out[f"eval/{name}_long_half"] + out[f"eval/{name}_short_half"]) / 2
        assert halves == pytest.approx(out[f"eval/{name}"], abs=1e-12)  # two halves of 20


SCORED, ANSWERS = evaluation.scored, evaluation.answers
