"""Tasks: prompts, reference answers and an exact verifier.

``sums`` — running sums, worked out. Prompt ``3,4,5,9:``, response ``3+4=7,7+5=12,12+9=21#21``
(7–44 characters). Reward 1 if the text after the last ``#`` is the true sum, else 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from omegaconf import DictConfig

from rlx_cli.errors import UserError


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


class SumsTask:
    """Procedural running sums; ``worked(terms, carry_drop, rng)`` writes a (possibly defective) solution."""

    def __init__(self, *, min_terms: int, max_terms: int, eval_size: int, eval_seed: int):
        if not 2 <= min_terms <= max_terms:
            raise UserError(
                f"task.min_terms={min_terms}, task.max_terms={max_terms} (valid: 2 <= min_terms <= max_terms)"
            )
        self.min_terms, self.max_terms = min_terms, max_terms
        self.eval_problems = [self.problem(t) for t in self._draw(random.Random(eval_seed), eval_size)]

    def _draw(self, rng: random.Random, n: int) -> list[list[int]]:
        return [[rng.randint(1, 9) for _ in range(rng.randint(self.min_terms, self.max_terms))] for _ in range(n)]

    @staticmethod
    def problem(terms: list[int]) -> Problem:
        return Problem(prompt=",".join(map(str, terms)) + ":", answer=str(sum(terms)))

    def train_problems(self, n: int, *, seed: int, step: int, draw: int = 0) -> list[Problem]:
        """``n`` fresh problems for one RL step; a pure function of (seed, step, draw), so resuming replays them."""
        return [self.problem(t) for t in self._draw(random.Random(f"train-{seed}-{step}-{draw}"), n)]

    def sft_examples(self, n: int, *, carry_drop: float, rng: random.Random) -> list[tuple[str, str]]:
        """(prompt, response) pairs whose carries are dropped with probability ``carry_drop`` per crossing."""
        return [(self.problem(t).prompt, worked(t, carry_drop, rng)) for t in self._draw(rng, n)]

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        return float(response.rpartition("#")[2].strip() == problem.answer and "#" in response)


def worked(terms: list[int], carry_drop: float, rng: random.Random) -> str:
    """``[3, 4, 5]`` -> ``3+4=7,7+5=12#12``; a crossing of a multiple of ten loses its carry w.p. ``carry_drop``."""
    total, steps = terms[0], []
    for term in terms[1:]:
        new = total + term
        if new // 10 > total // 10 and rng.random() < carry_drop:
            new -= 10
        steps.append(f"{total}+{term}={new}")
        total = new
    return ",".join(steps) + f"#{total}"


TASKS = {"sums": SumsTask}


def build_task(cfg: DictConfig) -> SumsTask:
    params = {k: v for k, v in cfg.items() if k != "name"}
    return TASKS[cfg.name](**params)
