"""Steps 1–2 of the loop: a step's groups of answers, sampled and scored; DAPO's dynamic sampling and its accounting;
``answers``, the policy's answers to problems, which evaluation and DPO's pairs draw with too.

Each step samples from a random stream of its own, a function of the seed, the process and the step
(``distributed.sampling_stream``), apart from the stream the update draws its minibatches from: a resumed run and the
overlapped sampler process (``rollout.overlap``, ``loops/overlap.py``) draw what the uninterrupted sequential run drew.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlx_cli.engine import distributed
from rlx_cli.engine.batch import Rollout
from rlx_cli.loops.build import Parts
from rlx_cli.loops.compute import SAMPLED, SAMPLED_TOKENS
from rlx_cli.sampling import credit

Origin = tuple[int, int, int]  # where a group's prompt came from: (step, draw, its place in the draw)


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


@dataclass
class Groups:
    """Scored groups, a group's ``group_size`` rows in a row: sampled answers, their scores, each group's origin.

    ``rollout.carry_surplus`` keeps one as the informative groups a step drew beyond its need, which the next step
    spends first; it is part of ``TrainState`` and so of every checkpoint (tensors in safetensors, the rest JSON)."""

    batch: Rollout | None = None  # [g · group_size, ...]
    scores: Tensor | None = None  # [g · group_size]
    origins: list[Origin] = field(default_factory=list)  # [g]

    def __len__(self) -> int:
        return len(self.origins)

    def take(self, n: int) -> Groups:
        """The first ``n`` groups (all, if fewer), removed from these."""
        n, size = min(n, len(self)), len(self.scores) // max(len(self), 1)
        first, rest = torch.arange(n * size), torch.arange(n * size, len(self.scores))
        taken = Groups(self.batch.select(first), self.scores[first], self.origins[:n])
        if n == len(self):
            self.batch, self.scores, self.origins = None, None, []
        else:
            self.batch, self.scores, self.origins = self.batch.select(rest), self.scores[rest], self.origins[n:]
        return taken

    def add(self, more: Groups, pad_id: int) -> None:
        """``more``'s groups after these."""
        if not len(more):
            return
        if self.batch is None:
            self.batch, self.scores, self.origins = more.batch, more.scores, list(more.origins)
            return
        self.batch = Rollout.concat([self.batch, more.batch], pad_id)
        self.scores, self.origins = torch.cat([self.scores, more.scores]), self.origins + list(more.origins)

    @staticmethod
    def restored(saved: dict | None) -> Groups:
        """A checkpoint's ``dataclasses.asdict`` form (``checkpoint.unpack``'s) back into Groups."""
        if not saved or saved["batch"] is None:
            return Groups()
        return Groups(Rollout(**saved["batch"]), saved["scores"], [tuple(o) for o in saved["origins"]])


def sample_groups(cfg, parts: Parts, step: int, model=None, carried: Groups | None = None):
    """Sample and score ``prompts_per_step`` groups of ``group_size`` -> (batch, scores [B], group_index [B], metrics).

    ``model`` samples (the behaviour policy: ``engine/behaviour.py``); None: the policy.

    With N processes, this process's block of the step's prompts (``distributed.gather_samples`` joins them).

    With ``rollout.dynamic_sampling`` (DAPO, arXiv 2503.14476) groups whose scores are all equal carry no signal for a
    group baseline: they are dropped and more prompts are drawn, up to ``rollout.max_draws`` batches. Informative
    groups beyond the batch's need are thrown away (verl's recipe) or, given ``carried`` (``rollout.carry_surplus``),
    added to it: the next step spends those first. ``train/groups_kept``: the groups this step drew that are not
    thrown away (in its batch or carried on); ``train/draws`` × ``prompts_per_step`` minus it were.
    """
    rollout, task, pad_id = cfg.rollout, parts.task, parts.models.tokenizer.pad_token_id
    size = rollout.group_size
    wanted = len(distributed.shard(range(rollout.prompts_per_step)))  # N processes: each its block of the prompts
    pieces, drawn_problems = [carried.take(wanted)] if carried else [], {}
    groups, draws, kept, scoring = sum(map(len, pieces)), 0, 0, 0.0
    drawn = {SAMPLED: 0.0, SAMPLED_TOKENS: 0.0}  # every answer generated, kept or not
    with distributed.sampling_stream(cfg.seed, step):
        while groups < wanted and draws < (rollout.max_draws if rollout.dynamic_sampling else 1):
            problems = task.train_problems(rollout.prompts_per_step, seed=cfg.seed, step=step, draw=draws)
            drawn_problems[step, draws] = problems = distributed.shard(problems)
            rows = [p for p in problems for _ in range(size)]
            batch = answers(cfg, parts, rows, rollout.temperature, model)
            drawn = {SAMPLED: drawn[SAMPLED] + len(batch.texts), SAMPLED_TOKENS: drawn[SAMPLED_TOKENS] + batch.tokens()}
            started = time.perf_counter()
            scores = torch.tensor(task.score_batch(batch.texts, rows))
            if cfg.trainer.placebo_reward:  # the draw's scores handed out by lot: none depends on its own answer
                scores = scores[torch.randperm(len(scores))]
            scoring += time.perf_counter() - started  # the verifier's time; a judge's forwards (task.verifier=judge)
            informative = torch.ones(wanted, dtype=torch.bool)
            if rollout.dynamic_sampling:
                by_group = scores.view(wanted, size)
                informative = (by_group != by_group[:, :1]).any(1)
            keep = informative & (informative.cumsum(0) <= wanted - groups)  # no more groups than still needed
            if not keep.any() and draws + 1 == rollout.max_draws and not pieces:
                keep = torch.ones(wanted, dtype=torch.bool)  # nothing informative at all: the last draw as it is
            if keep.any():
                pieces.append(drawn_groups(batch, scores, keep, size, (step, draws)))
            if carried is not None:
                carried.add(drawn_groups(batch, scores, informative & ~keep, size, (step, draws)), pad_id)
                kept += int((informative & ~keep).sum())
            groups, kept, draws = groups + int(keep.sum()), kept + int(keep.sum()), draws + 1
        batch = pieces[0].batch if len(pieces) == 1 else Rollout.concat([p.batch for p in pieces], pad_id)
        problems = [p for piece in pieces for p in problems_of(cfg, task, piece.origins, drawn_problems)]
        device = parts.models.device
        batch, annotated = credit.annotate(cfg, parts, batch.to(device), [p for p in problems for _ in range(size)])
    drawn[SAMPLED] += annotated.get("train/spo_continuations", 0.0)
    drawn[SAMPLED_TOKENS] += annotated.get("perf/spo_tokens", 0.0)
    return (
        batch,
        torch.cat([p.scores for p in pieces]).to(device),
        torch.arange(groups).repeat_interleave(size).to(device),
        {
            "train/groups": float(groups),
            "train/draws": float(draws),
            "train/groups_kept": float(kept),
            "train/reward_errors": float(task.reward_errors),  # cumulative verifier exceptions and time-outs
            **annotated,
            **drawn,
            "perf/score_s": scoring,
        },
    )


def drawn_groups(batch: Rollout, scores: Tensor, chosen: Tensor, size: int, draw: tuple[int, int]) -> Groups:
    """The ``chosen`` groups ([g] bool) of one draw's ``batch`` and ``scores``; ``draw``: its (step, draw)."""
    rows = chosen.repeat_interleave(size).nonzero().squeeze(1)
    return Groups(batch.select(rows), scores[rows], [(*draw, i) for i in chosen.nonzero().squeeze(1).tolist()])


def problems_of(cfg, task, origins: list[Origin], drawn: dict[tuple[int, int], list]) -> list:
    """The problem of each origin: from this step's ``drawn`` problems, or drawn again (a pure function of the seed,
    the step and the draw) for groups carried from an earlier step."""
    for step, draw, _ in origins:
        if (step, draw) not in drawn:
            problems = task.train_problems(cfg.rollout.prompts_per_step, seed=cfg.seed, step=step, draw=draw)
            drawn[step, draw] = distributed.shard(problems)
    return [drawn[step, draw][i] for step, draw, i in origins]
