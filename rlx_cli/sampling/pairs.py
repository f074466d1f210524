"""Preference pairs for ``algo=dpo``: a file of them (``task=pairs``), their order over steps, and their batches.

``task=pairs``: a JSONL or Parquet file with a prompt, a chosen and a rejected completion per row (field names
``task.prompt_field``, ``task.chosen_field``, ``task.rejected_field``), optionally a reference answer
(``task.answer_field``). The last ``task.eval_fraction`` of the rows (or ``task.eval_path``) are held out: their
preference accuracy is evaluated, and with answers the policy's own answers to their prompts (``task.verifier``).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlx_cli.engine.batch import Rollout
from rlx_cli.sampling.rollout import assemble
from rlx_cli.sampling.tasks import FileTask, Problem, formatted, train_and_eval_rows


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str
    answer: str = ""  # a reference answer, "" when there is none


class PairsTask(FileTask):
    """Preference pairs from a file; with ``answer_field`` its held-out prompts are also scored by the verifier."""

    def __init__(self, *, path, eval_path, eval_fraction: float, prompt_field: str, chosen_field: str,
                 rejected_field: str, answer_field: str | None, template: str, verifier: str,
                 answer_pattern: str | None, verifier_timeout: float):  # fmt: skip
        from rlx_cli.sampling.verifiers import load_verifier

        fields = (prompt_field, chosen_field, rejected_field, *([answer_field] if answer_field else []))
        keys = "task.prompt_field / task.chosen_field / task.rejected_field / task.answer_field"
        rows, eval_rows = train_and_eval_rows(path, eval_path, eval_fraction, fields, keys=keys)
        self.template, self.prompt_field, self.answer_field = template, prompt_field, answer_field
        self.chosen_field, self.rejected_field = chosen_field, rejected_field
        self.pairs = [self.pair(r) for r in rows]
        self.eval_pairs = [self.pair(r) for r in eval_rows]
        self.train = [Problem(p.prompt, p.answer) for p in self.pairs]
        self.eval_problems = [Problem(p.prompt, p.answer) for p in self.eval_pairs] if answer_field else []
        self.verify = load_verifier(verifier, answer_pattern)
        self.timeout = verifier_timeout
        self.reward_errors = 0

    def pair(self, row: dict) -> Pair:
        answer = str(row[self.answer_field]) if self.answer_field else ""
        prompt = formatted(self.template, row, self.prompt_field)
        return Pair(prompt, str(row[self.chosen_field]), str(row[self.rejected_field]), answer)

    def problem(self, row: dict) -> Problem:
        pair = self.pair(row)
        return Problem(pair.prompt, pair.answer)

    def texts(self) -> list[str]:
        """Every prompt, chosen and rejected completion and answer in the file."""
        return [text for p in self.pairs + self.eval_pairs for text in (p.prompt, p.chosen, p.rejected, p.answer)]


def pairs_for_step(pairs: list[Pair], n: int, *, seed: int, step: int) -> list[Pair]:
    """The ``n`` pairs of step ``step`` (1, 2, ...): epochs over ``pairs``, each in an order of its own drawn from
    (seed, epoch), so each pair is seen once per epoch; a pure function, so a resumed run draws the same."""
    orders: dict[int, list[int]] = {}
    out = []
    for i in range((step - 1) * n, step * n):
        epoch, position = divmod(i, len(pairs))
        if epoch not in orders:
            orders[epoch] = list(range(len(pairs)))
            random.Random(f"pairs-{seed}-{epoch}").shuffle(orders[epoch])
        out.append(pairs[orders[epoch][position]])
    return out


def pair_rollout(sampler, pairs: list[Pair]) -> Rollout:
    """P pairs as one batch of 2P rows: the chosen completions (rows 0..P−1), then the rejected ones (rows P..2P−1),
    each after its prompt rendered as ``sampler`` renders prompts, and ended by EOS (as TRL's DPO appends it)."""
    tokenizer = sampler.tokenizer
    enc = sampler.encode([p.prompt for p in pairs] * 2)
    completions = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    responses = torch.full((len(ids), max(map(len, ids))), tokenizer.pad_token_id, dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
    return assemble(tokenizer, enc, responses)


def write_pairs(path: Path, pairs: list[Pair]) -> None:
    """``pairs`` as JSONL (prompt, chosen, rejected, answer), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as out:
        out.writelines(json.dumps(asdict(p)) + "\n" for p in pairs)
    os.replace(tmp, path)


def read_pairs(path: Path) -> list[Pair]:
    return [Pair(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
