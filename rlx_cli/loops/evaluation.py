"""The policy's answers to problems, and evaluation on the task's held-out prompts: greedy and sampled accuracy,
unbiased pass@k."""

from __future__ import annotations

import math

import torch

from rlx_cli.engine import distributed
from rlx_cli.engine.batch import Rollout
from rlx_cli.loops.build import Parts


def answers(cfg, parts: Parts, problems: list, temperature: float, model=None, max_new_tokens=None) -> Rollout:
    """The answers of ``model`` (None: the policy) to ``problems`` (one each, ``max_new_tokens`` at most, None:
    ``rollout.max_new_tokens``; greedy at temperature 0)."""
    with parts.engine.sampling():
        return parts.sampler.generate(
            parts.models.policy if model is None else model,
            [p.prompt for p in problems],
            temperature=temperature,
            max_new_tokens=max_new_tokens or cfg.rollout.max_new_tokens,
        )


@torch.no_grad()
def evaluate(cfg, parts: Parts) -> dict[str, float]:
    """Greedy and sampled accuracy on the task's fixed held-out prompts -> eval/*.

    ``eval/accuracy``: one greedy answer per prompt. ``eval/accuracy_sampled``: the mean score of ``eval.samples``
    answers per prompt at the rollout temperature; from the same answers ``eval/pass_at_k`` for each k of
    ``eval.pass_k`` (pass@k: MLflow refuses "@" in a name), unbiased (``pass_at_k``), an answer scored 1 counting
    as correct. Answers get ``eval.max_new_tokens`` tokens at most (null: ``rollout.max_new_tokens``); each
    evaluation draws from the same random stream (``distributed.seed_evaluation``). N processes: each evaluates its
    block of the prompts; the sums are totalled.
    """
    task, n, ks = parts.task, cfg.eval.samples, list(cfg.eval.pass_k)
    problems, total = distributed.shard(task.eval_problems), len(task.eval_problems)
    out = {}
    devices = torch.random.fork_rng()  # evaluation must not shift the training samples' random stream
    with devices:
        distributed.seed_evaluation(cfg.seed)  # its own stream: arms of a study draw alike
        for name, temperature, repeats in (("accuracy", 0.0, 1), ("accuracy_sampled", cfg.rollout.temperature, n)):
            correct, tokens, passes = 0.0, 0.0, [0.0] * len(ks)
            if problems:  # more processes than prompts leave some without
                asked = [p for p in problems for _ in range(repeats)]  # a prompt's answers in a row: one prefill
                batch = answers(cfg, parts, asked, temperature, max_new_tokens=cfg.eval.max_new_tokens)
                scores = torch.tensor(task.score_batch(batch.texts, asked), dtype=torch.float64)
                correct, tokens = scores.sum().item() / repeats, batch.tokens()
                if name == "accuracy_sampled":
                    right = (scores >= 1).view(-1, repeats).sum(1)  # [prompts]
                    passes = [sum(pass_at_k(repeats, int(c), k) for c in right) for k in ks]
            out[f"eval/{name}"] = distributed.total(correct) / total
            if name == "accuracy":
                out["eval/response_len"] = distributed.total(tokens) / total
        out |= {f"eval/pass_at_{k}": distributed.total(p) / total for k, p in zip(ks, passes)}
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` answers of which ``c`` are correct (Chen et al. 2021, arXiv
    2107.03374): 1 − C(n − c, k) / C(n, k), the chance that k of the n drawn without replacement hold a correct one."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
