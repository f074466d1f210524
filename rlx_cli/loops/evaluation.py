"""Evaluation on the task's held-out prompts: greedy and sampled accuracy with their standard errors, unbiased pass@k
(the answers drawn by ``groups.answers``, as training's)."""

from __future__ import annotations

import math

import torch

from rlx_cli.engine import distributed
from rlx_cli.loops.build import Parts
from rlx_cli.loops.groups import answers

EVAL_BLOCK = 16  # prompts whose sampled answers come from one random stream (seed_evaluation), drawn in one batch


@torch.no_grad()
def evaluate(cfg, parts: Parts) -> dict[str, float]:
    """Greedy and sampled accuracy on the task's fixed held-out prompts, with their standard errors -> eval/*.

    ``eval/accuracy``: one greedy answer per prompt. ``eval/accuracy_sampled``: the mean score of ``eval.samples``
    answers per prompt at the rollout temperature; from the same answers ``eval/pass_at_k`` for each k of
    ``eval.pass_k`` (pass@k: MLflow refuses "@" in a name), unbiased (``pass_at_k``), an answer scored 1 counting
    as correct. ``eval/accuracy_se`` and ``eval/accuracy_sampled_se``: the standard error of each over the prompts
    (``standard_error``; with several answers a prompt the cluster standard error, prompts the clusters). Answers
    get ``eval.max_new_tokens`` tokens at most (null: ``rollout.max_new_tokens``).

    Common random numbers: the prompts are cut into blocks of ``EVAL_BLOCK``, each sampled in one batch from a stream
    of its own (``distributed.seed_evaluation``: the seed and the block), so every evaluation of every run with this
    seed, whatever its arm and its number of processes, draws the same numbers for the same prompts. Within a block
    ``rollout=fast`` gives each row its own draws (``fast_rollout.pick``), so a prompt whose neighbours' answers
    change (another length, another token) keeps its own; ``rollout=hf`` keeps every row in the batch to the end,
    drawing for all of them at every step, to the same effect. N processes: each
    evaluates its share of the blocks; the sums are totalled.
    """
    task, n, ks = parts.task, cfg.eval.samples, list(cfg.eval.pass_k)
    every, total = task.eval_problems, len(task.eval_problems)
    blocks = distributed.shard([(b, every[i : i + EVAL_BLOCK]) for b, i in enumerate(range(0, total, EVAL_BLOCK))])
    problems = [p for _, block in blocks for p in block]
    out = {}
    devices = torch.random.fork_rng()  # evaluation must not shift the training samples' random stream
    with devices:
        greedy, tokens = scored(cfg, parts, problems, 0.0, 1)  # [prompts, 1]: no random numbers drawn
        sampled = torch.zeros(0, n, dtype=torch.float64)
        for b, block in blocks:
            distributed.seed_evaluation(cfg.seed, b)
            sampled = torch.cat([sampled, scored(cfg, parts, block, cfg.rollout.temperature, n)[0]])
    longer = longer_half([p.prompt for p in every])
    in_longer = torch.tensor([b * EVAL_BLOCK + i in longer for b, block in blocks for i in range(len(block))])
    for name, scores in (("accuracy", greedy), ("accuracy_sampled", sampled)):
        out[f"eval/{name}"], out[f"eval/{name}_se"] = standard_error(scores.mean(1), total)
        for half, rows, count in (("long", in_longer, len(longer)), ("short", ~in_longer, total - len(longer))):
            out[f"eval/{name}_{half}_half"] = distributed.total(float(scores.mean(1)[rows].sum())) / max(count, 1)
    out["eval/response_len"] = distributed.total(tokens) / total
    right = (sampled >= 1).sum(1)  # [prompts]: the correct answers of each
    out |= {f"eval/pass_at_{k}": distributed.total(sum(pass_at_k(n, int(c), k) for c in right)) / total for k in ks}
    return out


def longer_half(prompts: list[str]) -> set[int]:
    """The positions of the longer half of ``prompts`` by characters (ties by position; the middle one of an odd
    count goes to the shorter half): the held-out split behind ``eval/*_long_half`` and ``eval/*_short_half``."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    return set(order[(len(prompts) + 1) // 2 :])


def scored(cfg, parts: Parts, problems: list, temperature: float, repeats: int) -> tuple[torch.Tensor, float]:
    """``repeats`` answers to each of ``problems`` (a prompt's in a row: one prefill) -> (their scores [prompts,
    repeats] float64, the answers' tokens)."""
    if not problems:  # more processes than blocks leave some without
        return torch.zeros(0, repeats, dtype=torch.float64), 0.0
    asked = [p for p in problems for _ in range(repeats)]
    batch = answers(cfg, parts, asked, temperature, max_new_tokens=cfg.eval.max_new_tokens)
    scores = torch.tensor(parts.task.score_batch(batch.texts, asked), dtype=torch.float64)
    return scores.view(-1, repeats), float(batch.tokens())


def standard_error(means: torch.Tensor, total: int) -> tuple[float, float]:
    """The mean of per-prompt means ``means`` [this process's prompts] over all ``total`` prompts, and its standard
    error sqrt(Σ (m_i - m̄)² / (P (P - 1))): over prompts, or, where each m_i averages a prompt's k answers, the
    cluster standard error with the prompts as clusters (equal sizes), which counts a prompt's answers as one unit
    since they share its difficulty. NaN SE for a single prompt."""
    mean = distributed.total(float(means.sum())) / total
    squares = distributed.total(float((means * means).sum()))
    if total < 2:
        return mean, float("nan")
    return mean, math.sqrt(max(squares - total * mean * mean, 0.0) / (total * (total - 1)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` answers of which ``c`` are correct (Chen et al. 2021, arXiv
    2107.03374): 1 − C(n − c, k) / C(n, k), the chance that k of the n drawn without replacement hold a correct one."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
