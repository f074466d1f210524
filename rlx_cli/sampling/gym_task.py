"""``task=gym``: procedural problems from reasoning-gym (the optional extra ``pip install -e '.[gym]'``).

``task.dataset`` names one of its generators (``chain_sum``, ``basic_arithmetic``, ``leg_counting``, ...) and
``task.config`` is passed to it (its difficulty: ``{max_terms: 3, max_digits: 2}``). An entry is a question, an
answer and metadata; the prompt is ``task.template`` filled with ``{question}`` and ``{instruction}`` (how to
answer). The reward is the dataset's own ``score_answer(extracted, entry)``, in [0, 1]; most datasets give 1 for
the exact answer and len(answer)/len(extracted) when the answer is a substring of what was extracted.

Answer extraction (``task.answer_format``): ``tag``, the text inside the last ``<answer>...</answer>`` (reasoning-gym's
own ``extract_answer``; no tag scores 0); ``plain``, the whole response, stripped.

Held-out prompts are entries ``0 .. eval_size-1`` of the generator seeded ``task.eval_seed``; a generator seeds each
entry ``seed + index``, so training draws, from a generator seeded ``TRAIN_SEED`` (above every held-out seed), never
share a random stream with them, and a drawn question equal to a held-out one is drawn again.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from rlx_cli.config.errors import UserError
from rlx_cli.sampling.tasks import Problem

EXTRA = "pip install -e '.[gym]'"
TRAIN_SEED = 10**9  # training entries are seeded 10**9 + index; held-out ones eval_seed + index, below it
INDICES = 10**8  # training draws an entry index from [0, INDICES)
REDRAWS = 1000  # draws of one problem before giving up on finding a question that is not held out
VOCAB_SAMPLE = 2000  # training entries whose text, with the held-out set, makes the built-in tokenizer's alphabet
SPACE_DRAWS = 20_000  # training draws that count a config's distinct questions at start-up (0.5 s on chain_sum)
INSTRUCTIONS = {"tag": "Answer in <answer></answer>.", "plain": ""}


@dataclass(frozen=True)
class GymProblem(Problem):
    entry: dict = field(default_factory=dict, compare=False, hash=False)  # what the dataset's scorer reads


def import_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise UserError(f"task=gym needs reasoning-gym, which is not installed: {EXTRA}") from None
    return reasoning_gym


def generator(name: str, config: dict, *, seed: int, size: int):
    """reasoning-gym's dataset ``name`` with ``config``; one line for an unknown name, key or value."""
    from reasoning_gym.factory import DATASETS, create_dataset

    if name not in DATASETS:
        raise UserError(f"task.dataset={name} is not a reasoning-gym dataset (valid: {', '.join(sorted(DATASETS))})")
    settings = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("seed", "size")]
    unknown = sorted(set(config) - set(settings))
    if unknown:
        raise UserError(f"task.config.{unknown[0]} is not a setting of {name} (valid: {', '.join(settings)})")
    try:
        return create_dataset(name, **config, seed=seed, size=size)
    except (AssertionError, ValueError, TypeError) as error:  # its config's own checks (RLX_DEBUG=1: the traceback)
        raise UserError(f"task.config={config} is not valid for {name}: {error or type(error).__name__}") from error


class GymTask:
    """Problems from one reasoning-gym generator, scored by its ``score_answer`` on the extracted answer."""

    reward_errors = 0  # the dataset's scorer is called directly: an exception is a bug, not a reward
    scores_steps = False

    def __init__(
        self,
        *,
        dataset: str,
        config,
        eval_size: int,
        eval_seed: int,
        template: str,
        answer_format: str,
        verifier: str = "exact",
    ):
        self.gym = import_gym()
        if answer_format not in INSTRUCTIONS:
            raise UserError(f"task.answer_format={answer_format} is not valid (valid: {', '.join(INSTRUCTIONS)})")
        if verifier not in ("exact", "judge"):  # judge: a model scores instead (sampling/judge.py wraps the task)
            raise UserError(f"task.verifier={verifier} is not valid for task=gym (valid: exact, judge)")
        if not 1 <= eval_size <= INDICES:
            raise UserError(f"task.eval_size={eval_size} is out of range (valid: 1 to {INDICES})")
        if not 0 <= eval_seed <= TRAIN_SEED - eval_size:
            raise UserError(f"task.eval_seed={eval_seed} is out of range (valid: 0 to {TRAIN_SEED - eval_size})")
        config = dict(config or {})
        self.dataset, self.template, self.answer_format = dataset, template, answer_format
        self.held_out = generator(dataset, config, seed=eval_seed, size=eval_size)
        self.train = generator(dataset, config, seed=TRAIN_SEED, size=INDICES)
        self.eval_problems = [self.problem(self.held_out[i]) for i in range(eval_size)]
        self.held_out_questions = {p.entry["question"] for p in self.eval_problems}

    def problem(self, entry: dict) -> GymProblem:
        instruction = INSTRUCTIONS[self.answer_format]
        try:
            prompt = self.template.format(question=entry["question"], instruction=instruction)
        except (KeyError, IndexError, ValueError) as error:
            raise UserError(
                f"task.template={self.template!r} does not fit: {error} (valid fields: {{question}}, {{instruction}})"
            ) from None
        return GymProblem(prompt=prompt, answer=str(entry["answer"]), entry=entry)

    def draw(self, rng: random.Random) -> dict:
        """One training entry whose question is not held out."""
        for _ in range(REDRAWS):
            entry = self.train[rng.randrange(INDICES)]
            if entry["question"] not in self.held_out_questions:
                return entry
        raise UserError(
            f"task.config leaves {self.dataset} too few questions: {REDRAWS} draws were all held-out ones "
            "(valid: a harder config or a smaller task.eval_size)"
        )

    def distinct_training_questions(self, enough: int) -> int | None:
        """The distinct questions, held-out ones excluded, that ``SPACE_DRAWS`` training draws find (from a stream of
        their own, so every run counts alike), or None as soon as more than ``enough`` turn up: where the count stays
        far below the draws, it is the config's whole training space (chain_sum at 2 terms of 1 digit: 67)."""
        rng, seen = random.Random("question-space"), set()
        for _ in range(SPACE_DRAWS):
            question = self.train[rng.randrange(INDICES)]["question"]
            if question not in self.held_out_questions:
                seen.add(question)
                if len(seen) > enough:
                    return None
        return len(seen)

    def train_problems(self, n: int, *, seed: int, step: int, draw: int = 0) -> list[GymProblem]:
        """``n`` problems for one RL step; a pure function of (seed, step, draw), so resuming replays them."""
        rng = random.Random(f"train-{seed}-{step}-{draw}")
        return [self.problem(self.draw(rng)) for _ in range(n)]

    def respond(self, answer: str) -> str:
        """An answer written as the policy should write it."""
        return f"<answer>{answer}</answer>" if self.answer_format == "tag" else answer

    def extract(self, response: str) -> str | None:
        if self.answer_format == "tag":
            return self.gym.utils.extract_answer(response, tag_name="answer")
        return response.strip()

    def score(self, response: str, problem: GymProblem) -> float:
        return float(self.held_out.score_answer(self.extract(response), problem.entry))

    def score_batch(self, responses: list[str], problems: list[GymProblem]) -> list[float]:
        return [self.score(r, p) for r, p in zip(responses, problems)]

    def sft_examples(self, n: int, *, rng: random.Random, defect: float = 0.0) -> list[tuple[str, str]]:
        """(prompt, response) pairs for the built-in base: the dataset's answer, or with probability ``defect`` the
        answer of another drawn problem (well formed, almost always wrong): the flaw RL can fix."""
        examples = []
        for _ in range(n):
            problem = self.problem(self.draw(rng))
            answer = str(self.draw(rng)["answer"]) if defect > 0 and rng.random() < defect else problem.answer
            examples.append((problem.prompt, self.respond(answer)))
        return examples

    def chars(self) -> str:
        """Every character the prompts and responses use (held-out set and ``VOCAB_SAMPLE`` training entries): the
        built-in base's alphabet; a character outside it reads as padding."""
        entries = [self.train[i] for i in range(VOCAB_SAMPLE)] + [p.entry for p in self.eval_problems]
        text = "".join(self.problem(e).prompt + self.respond(str(e["answer"])) for e in entries)
        return "".join(sorted(set(text)))

    def recipe(self) -> dict:
        """What makes the built-in base for this task besides its config (part of the cache key)."""
        from importlib.metadata import version

        return {"reasoning_gym": version("reasoning-gym")}  # the package's __version__ string lags its releases
