"""Tasks: prompts, reference answers and an exact verifier.

``sums`` — running sums, worked out. Prompt ``3,4,5,9:``, response ``3+4=7,7+5=12,12+9=21#21``
(7–44 characters). Reward 1 if the text after the last ``#`` is the true sum, else 0. A base model whose SFT data
mixes in direct answers (``#21``, ``model.sft.direct_frac``) chooses how long to answer (``task=shortcut_sums``).

A task whose ``scores_steps`` is true also scores each step of a response (process supervision):
``score_steps(responses, problems)`` -> per response a list of (end, reward), ``end`` the offset just past the
step's last character; ``rlx_cli/sampling/credit.py`` puts each reward on the token holding that character.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from rlx_cli.config.errors import UserError
from rlx_cli.config.validate import check_pool_holds


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


class SumsTask:
    """Procedural running sums; ``worked(terms, carry_drop, rng)`` writes a (possibly defective) solution."""

    reward_errors = 0  # the exact verifier cannot fail
    scores_steps = True  # every a+b=c step is checkable (sum_steps)

    def __init__(
        self,
        *,
        min_terms: int,
        max_terms: int,
        eval_size: int,
        eval_seed: int,
        verifier: str = "exact",
        pool: int | None = None,
    ):
        if not 2 <= min_terms <= max_terms:
            raise UserError(
                f"task.min_terms={min_terms}, task.max_terms={max_terms} (valid: 2 <= min_terms <= max_terms)"
            )
        # judge: a model scores instead (sampling/judge.py wraps the task)
        if verifier not in ("exact", "judge"):
            raise UserError(f"task.verifier={verifier} is not valid for task=sums (valid: exact, judge)")
        self.min_terms, self.max_terms, self.pool = min_terms, max_terms, pool
        self.eval_problems = [self.problem(t) for t in self._draw(random.Random(eval_seed), eval_size)]

    def _draw(self, rng: random.Random, n: int) -> list[list[int]]:
        return [[rng.randint(1, 9) for _ in range(rng.randint(self.min_terms, self.max_terms))] for _ in range(n)]

    @staticmethod
    def problem(terms: list[int]) -> Problem:
        return Problem(prompt=",".join(map(str, terms)) + ":", answer=str(sum(terms)))

    def train_problems(self, n: int, *, seed: int, step: int, draw: int = 0) -> list[Problem]:
        """``n`` problems for one RL step: fresh ones, or with ``task.pool`` N distinct ones of a pool of N drawn
        once per seed (a fixed training set, as a layout of fewer prompts a step sees over a run); a pure function
        of (seed, step, draw), so resuming replays them."""
        rng = random.Random(f"train-{seed}-{step}-{draw}")
        if self.pool is None:
            return [self.problem(t) for t in self._draw(rng, n)]
        check_pool_holds(self.pool, n, f"the {n} problems this draw takes")
        return [self.problem(t) for t in rng.sample(self._draw(random.Random(f"pool-{seed}"), self.pool), n)]

    def sft_examples(
        self, n: int, *, carry_drop: float, rng: random.Random, direct_frac: float = 0.0, direct_right: float = 1.0
    ) -> list[tuple[str, str]]:
        """(prompt, response) pairs: worked solutions whose carries are dropped with probability ``carry_drop`` per
        crossing or, with probability ``direct_frac``, a direct answer ``#N`` (see ``direct``)."""
        return [
            (
                self.problem(t).prompt,
                direct(t, direct_right, rng) if chance(rng, direct_frac) else worked(t, carry_drop, rng),
            )
            for t in self._draw(rng, n)
        ]

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        return float(response.rpartition("#")[2].strip() == problem.answer and "#" in response)

    def score_batch(self, responses: list[str], problems: list[Problem]) -> list[float]:
        return [self.score(r, p) for r, p in zip(responses, problems)]

    def score_steps(self, responses: list[str], problems: list[Problem]) -> list[list[tuple[int, float]]]:
        return [sum_steps(r, p) for r, p in zip(responses, problems)]


def sum_steps(response: str, problem: Problem) -> list[tuple[int, float]]:
    """The steps of a sums response as (end, reward): each ``a+b=c`` before the ``#`` (split at commas), then
    the answer ``#N`` when there is one.

    Step k is correct (1.0) if it reads ``a+b=c`` with b the prompt's (k+1)-th term, c = a + b and a the response's
    own previous total: the first term for the first step, the previous step's c after it (not checked after a
    step that does not parse), so one wrong step costs only itself. The answer step scores as the task does
    (N is the true sum). ``3+4=7,7+5=2,2+9=11#11`` for ``3,4,5,9:``: 1, 0, 1, 0.
    """
    terms = [int(t) for t in problem.prompt.rstrip(":").split(",")]
    body, hash_sign, _ = response.partition("#")
    steps, total = [], terms[0]
    for k, piece in enumerate(re.finditer(r"[^,]+", body)):
        parsed = re.fullmatch(r"(\d+)\+(\d+)=(\d+)", piece.group())
        a, b, c = map(int, parsed.groups()) if parsed else (None, None, None)
        right = parsed is not None and k + 1 < len(terms) and b == terms[k + 1] and c == a + b
        steps.append((piece.end(), float(right and (total is None or a == total))))
        total = c
    if hash_sign:
        steps.append((len(response.rstrip()), SumsTask.score(response, problem)))
    return steps


def chance(rng: random.Random, p: float) -> bool:
    """True with probability ``p``; draws nothing from ``rng`` when ``p`` is 0 (the built-in bases stay as built)."""
    return p > 0 and rng.random() < p


def direct(terms: list[int], right: float, rng: random.Random) -> str:
    """``[3, 4, 5]`` -> ``#12`` with probability ``right``, else ``#N`` with N off the sum by 1–9 either way
    (never below 0): an answer with no work, short and often wrong."""
    total = sum(terms)
    if not chance(rng, right):
        total = abs(total + rng.choice([-1, 1]) * rng.randint(1, 9))
    return f"#{total}"


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


class FileTask:
    """Prompts and reference answers from a JSONL or Parquet file, scored by a named verifier.

    Each row needs ``prompt_field`` and ``answer_field``; ``template`` formats the prompt from the row
    (``{prompt}`` is the prompt field). The eval set is ``eval_path`` or the last ``eval_fraction`` of rows.
    """

    def __init__(
        self,
        *,
        path,
        eval_path,
        eval_fraction: float,
        prompt_field: str,
        answer_field: str,
        template: str,
        verifier: str,
        answer_pattern: str | None,
        verifier_timeout: float,
        step_verifier: str | None = None,
    ):
        from rlx_cli.sampling.verifiers import import_function, load_verifier

        rows, eval_rows = train_and_eval_rows(path, eval_path, eval_fraction, (prompt_field, answer_field))
        self.template, self.prompt_field, self.answer_field = template, prompt_field, answer_field
        self.train = [self.problem(r) for r in rows]
        self.eval_problems = [self.problem(r) for r in eval_rows]
        self.verify = load_verifier(verifier, answer_pattern)
        self.step_verify = import_function("task.step_verifier", step_verifier) if step_verifier else None
        self.scores_steps = self.step_verify is not None
        self.timeout = verifier_timeout
        self.reward_errors = 0  # verifier exceptions and time-outs so far, each scored 0

    def problem(self, row: dict) -> Problem:
        return Problem(prompt=formatted(self.template, row, self.prompt_field), answer=str(row[self.answer_field]))

    def texts(self) -> list[str]:
        """Every prompt and reference answer in the file: what a tokenizer must be able to write."""
        return [text for p in self.train + self.eval_problems for text in (p.prompt, p.answer)]

    def train_problems(self, n: int, *, seed: int, step: int, draw: int = 0) -> list[Problem]:
        rng = random.Random(f"train-{seed}-{step}-{draw}")
        return [rng.choice(self.train) for _ in range(n)]

    def score(self, response: str, problem: Problem) -> float:
        return self.score_batch([response], [problem])[0]

    def score_batch(self, responses: list[str], problems: list[Problem]) -> list[float]:
        from rlx_cli.sampling.verifiers import score_all

        rewards, errors = score_all(self.verify, [(r, p.answer) for r, p in zip(responses, problems)], self.timeout)
        self.reward_errors += errors
        return rewards

    def score_steps(self, responses: list[str], problems: list[Problem]) -> list[list[tuple[int, float]]]:
        """``task.step_verifier(response, answer, prompt)`` on every response (see ``verifiers.py``)."""
        from rlx_cli.sampling.verifiers import score_steps_all

        calls = [(r, p.answer, p.prompt) for r, p in zip(responses, problems)]
        steps, errors = score_steps_all(self.step_verify, calls, self.timeout)
        self.reward_errors += errors
        return steps


FIELD_KEYS = "task.prompt_field / task.answer_field"  # the settings that name a file's fields


def formatted(template: str, row: dict, prompt_field: str) -> str:
    """``task.template`` filled from ``row`` (``{prompt}`` is its prompt field); one line if it does not fit."""
    try:
        return template.format(**{**row, "prompt": row[prompt_field]})
    except (KeyError, IndexError, ValueError) as error:
        raise UserError(f"task.template={template!r} does not fit the rows: {error}") from None


def train_and_eval_rows(path, eval_path, eval_fraction: float, fields: tuple[str, ...], keys: str = FIELD_KEYS):
    """(training rows, held-out rows): ``task.eval_path``'s rows, or the last ``task.eval_fraction`` of the file's."""
    rows = read_rows(path, "task.path", fields, keys)
    if eval_path:
        return rows, read_rows(eval_path, "task.eval_path", fields, keys)
    if not 0 < eval_fraction < 1:
        raise UserError(f"task.eval_fraction={eval_fraction} is out of range (valid: between 0 and 1)")
    cut = max(1, round(len(rows) * (1 - eval_fraction)))
    return rows[:cut], rows[cut:] or rows[-1:]


def read_rows(path, key: str, fields: tuple[str, ...], keys: str = FIELD_KEYS) -> list[dict]:
    """Rows of a ``.jsonl``/``.json`` or ``.parquet`` file; one clear line for every way it can be wrong (``keys``:
    the settings that name the ``fields``)."""
    import pandas as pd

    file = Path(str(path)).expanduser()
    if not file.is_file():
        raise UserError(f"{key}={path} does not exist (valid: a .jsonl or .parquet file)")
    try:
        if file.suffix == ".parquet":
            frame = pd.read_parquet(file)
        elif file.suffix in (".jsonl", ".json"):
            frame = pd.read_json(file, lines=file.suffix == ".jsonl", dtype=False)
        else:
            raise UserError(f"{key}={path} has an unknown format (valid: .jsonl, .json, .parquet)")
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - pandas/pyarrow raise many kinds for a malformed file
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{key}={path} cannot be read: {first}") from None
    if frame.empty:
        raise UserError(f"{key}={path} has no rows")
    missing = [f for f in fields if f not in frame.columns]
    if missing:
        raise UserError(
            f"{key}={path} has no field {missing[0]!r} (fields: {', '.join(map(str, frame.columns))}); set {keys}"
        )
    return frame.to_dict("records")
