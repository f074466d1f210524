"""A generative verifier: a judge LM reads the question, the reference answer and a response, and says yes or no
(Su et al. 2025, "Expanding RL with Verifiable Rewards Across Diverse Domains").

``task.verifier=judge`` wraps the task (``JudgedTask``): prompts and answers stay the task's, rewards come from the
judge. Its prompt is ``task.judge.template`` with the fields ``{question}`` (the task's prompt), ``{reference}``
(its answer) and ``{response}`` (the whole response, or with ``task.judge.final_step`` only the text after its last
``task.judge.step_separator``, as the paper's released judge is shown it), inside the judge tokenizer's chat template
when ``task.judge.chat_template`` and it has one. One forward pass per ``task.judge.rows`` answers, no sampling, gives
the logits z of the judge's first output token:

- soft (default): P(yes) / (P(yes) + P(no)) = softmax(z_yes, z_no)[0], the two words' probabilities renormalised;
- ``task.judge.hard=true``: 1 if yes is the most likely token of the whole vocabulary (what greedy decoding would
  answer), else 0.

The two words must be single tokens of the judge's tokenizer (checked when the run is built). The judge runs on the
training device in the dtype of the frozen weights (float32 under ``trainer.precision=fp32``, else bfloat16). An
answer the judge cannot read (a prompt longer than its context, non-finite logits, an error in its forward) scores 0
and counts in ``train/reward_errors``; the loop times scoring in ``perf/score_s``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import Tensor

from rlx_cli.config.errors import UserError
from rlx_cli.engine.batch import position_ids

FIELDS = ("question", "reference", "response")


def judge_reward(logits: Tensor, yes: int, no: int, *, hard: bool = False) -> Tensor:
    """Rewards ``[b]`` from the judge's next-token logits ``[b, V]``: softmax over (yes, no) taken at yes, or with
    ``hard`` 1.0 where yes is the argmax of the vocabulary; NaN where the two logits are not finite."""
    pair = logits[:, [yes, no]].float()
    value = (logits.argmax(-1) == yes).float() if hard else pair.softmax(-1)[:, 0]
    return torch.where(torch.isfinite(pair).all(-1), value, torch.full_like(value, math.nan))


def single_token(tokenizer, word: str, key: str) -> int:
    """The id of ``word`` in the judge's vocabulary; one line naming ``key`` unless it is exactly one known token."""
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise UserError(f"{key}={word!r} is {len(ids)} tokens for the judge's tokenizer (valid: one token of it)")
    if ids[0] == tokenizer.unk_token_id and word != tokenizer.unk_token:
        raise UserError(f"{key}={word!r} is not in the judge's vocabulary (valid: one token of it)")
    return ids[0]


class Judge:
    """A causal LM that scores (question, reference, response) triples with its yes/no probability."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        template: str,
        yes: str,
        no: str,
        hard: bool = False,
        final_step: bool = False,
        step_separator: str = "\n",
        chat_template: bool = False,
        rows: int = 64,
    ):
        try:
            template.format(**dict.fromkeys(FIELDS, ""))
        except (KeyError, IndexError, ValueError) as error:
            raise UserError(
                f"task.judge.template={template!r} does not fit: {error!r} (valid fields: {', '.join(FIELDS)})"
            ) from None
        self.model, self.tokenizer = model.eval().requires_grad_(False), tokenizer
        self.template, self.hard, self.rows = template, hard, rows
        self.final_step, self.step_separator = final_step, step_separator
        self.chat_template = chat_template and getattr(tokenizer, "chat_template", None) is not None
        self.yes, self.no = single_token(tokenizer, yes, "task.judge.yes"), single_token(tokenizer, no, "task.judge.no")
        if self.yes == self.no:
            raise UserError(f"task.judge.yes={yes!r} and task.judge.no={no!r} are the same token (valid: two tokens)")
        self.max_tokens = getattr(model.config, "max_position_embeddings", None) or math.inf
        self.pad = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)

    @classmethod
    def load(cls, cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> Judge:
        """The judge ``task.judge`` describes, on ``device`` with weights in ``dtype``."""
        from rlx_cli.engine.models import from_pretrained

        model, tokenizer = from_pretrained(Path(cfg.path), "task.judge.path", dtype, trust_remote_code=False)
        options = {
            key: cfg[key] for key in ("template", "hard", "final_step", "step_separator", "chat_template", "rows")
        }
        words = {"yes": str(cfg["yes"]), "no": str(cfg["no"])}  # yes=1 on the command line arrives as an int
        return cls(model.to(device), tokenizer, **options, **words)

    def prompt(self, question: str, reference: str, response: str) -> list[int]:
        """The judge's token ids for one answer."""
        if self.final_step:
            response = response.strip().rsplit(self.step_separator, 1)[-1]
        text = self.template.format(question=question, reference=reference, response=response)
        if self.chat_template:
            messages = [{"role": "user", "content": text}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=not self.chat_template)["input_ids"]

    @torch.no_grad()
    def score(self, questions: list[str], references: list[str], responses: list[str]) -> tuple[list[float], int]:
        """-> (a reward in [0, 1] per answer, how many answers it could not judge: those score 0)."""
        encoded = [self.prompt(*triple) for triple in zip(questions, references, responses)]
        rewards = [math.nan] * len(encoded)
        readable = [i for i, ids in enumerate(encoded) if 0 < len(ids) <= self.max_tokens]
        for start in range(0, len(readable), self.rows):
            chunk = readable[start : start + self.rows]
            try:
                values = self.forward([encoded[i] for i in chunk]).tolist()
            except Exception:  # noqa: BLE001 - out of memory, a model's own error: these answers score 0
                continue
            for i, value in zip(chunk, values):
                rewards[i] = value
        failed = [not math.isfinite(r) for r in rewards]
        return [0.0 if bad else r for r, bad in zip(rewards, failed)], sum(failed)

    def forward(self, rows: list[list[int]]) -> Tensor:
        """Rewards ``[b]`` of token-id rows: one left-padded forward, the logits of the token after each row."""
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row)
            attention[i, width - len(row) :] = 1
        device = self.model.device
        inputs = {"input_ids": ids, "attention_mask": attention, "position_ids": position_ids(attention)}
        logits = self.model(**{k: v.to(device) for k, v in inputs.items()}, logits_to_keep=1).logits[:, -1]
        return judge_reward(logits, self.yes, self.no, hard=self.hard).cpu()


class JudgedTask:
    """``task`` with its answers scored by ``judge``; prompts, answers and everything else are the task's."""

    def __init__(self, task, judge: Judge):
        self.task, self.judge = task, judge
        self.reward_errors = 0  # answers the judge could not read so far, each scored 0

    def __getattr__(self, name: str):  # only for names it does not have itself
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def score_batch(self, responses: list[str], problems: list) -> list[float]:
        questions, references = [p.prompt for p in problems], [p.answer for p in problems]
        rewards, errors = self.judge.score(questions, references, responses)
        self.reward_errors += errors
        return rewards

    def score(self, response: str, problem) -> float:
        return self.score_batch([response], [problem])[0]


def judged(task, cfg: DictConfig, device: torch.device, dtype: torch.dtype):
    """``task`` scored as ``task.verifier`` says: by the judge model of ``task.judge``, or by its own verifier."""
    if cfg.get("verifier") != "judge":
        return task
    return JudgedTask(task, Judge.load(cfg.judge, device, dtype))
