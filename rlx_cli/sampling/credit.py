"""Credit below the answer: the per-token annotations a rollout carries for the advantage.

Both are added to each process's sampled batch (``loop.sample_groups``) as named ``[B, T]`` tensors in
``Rollout.annotations``, which the loop passes to the advantage by name:

- **Step rewards** (process supervision, DeepSeekMath §4.1.3), when the advantage takes them and the task scores
  steps (``task.scores_steps``: the built-in sums, or ``task=jsonl task.step_verifier=module:function``): each step's
  (end, reward) goes to the token that holds the step's last character, found through the tokenizer
  (``token_char_ends``; a step ending inside a token maps to that token). ``step_rewards`` holds the rewards,
  ``step_ends`` 1 there; a token that ends several steps gets the lowest of their rewards. Logged (``step_metrics``):
  ``train/steps_per_answer``, ``train/step_accuracy`` (the mean step reward: the share of right steps for 0/1).
- **SPO-chain's values** (Guo et al. 2025; AIFrameResearch/SPO), when the advantage takes ``cut_values``
  (``advantage=spo_chain``): the trainer's probability of every sampled token at the rollout temperature,
  cutpoints (``components.advantage.spo_cutpoints``), and from each cutpoint's prefix ``rollout.spo.continuations``
  continuations drawn by the run's own sampler (HF or vLLM) with the rollout's settings; V = their mean reward,
  a continuation cut at ``rollout.max_new_tokens`` (prefix included) without EOS scoring
  ``rollout.spo.unfinished_reward``; the terminal value R is the row's score as the loop passes it (after
  ``reward_shaping``, none in ``algo=spo``). Counted: ``train/spo_cutpoints``, ``train/spo_continuations``
  (samples beyond the step's prompts x group_size), ``perf/spo_s``, ``perf/spo_tokens``; ``perf/generate_s``
  includes them.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from itertools import accumulate

import torch

from components.advantage import spo_cutpoints
from rlx_cli.engine.batch import Rollout


def annotate(cfg, parts, batch: Rollout, problems: list) -> tuple[Rollout, dict[str, float]]:
    """``batch`` (this process's sampled rows, on the model's device; ``problems`` one per row) with the annotations
    the task and the advantage call for -> (batch, metrics to sum over processes)."""
    task, metrics = parts.task, {}
    if getattr(task, "scores_steps", False) and parts.components["advantage"].takes("step_rewards"):
        steps = task.score_steps(batch.texts, problems)
        batch.annotations.update(step_tensors(steps, batch, parts.models.tokenizer))
    if parts.components["advantage"].takes("cut_values"):
        metrics = spo_values(cfg, parts, batch, problems)
    return batch, metrics


def step_tensors(steps: list[list[tuple[int, float]]], batch: Rollout, tokenizer) -> dict[str, torch.Tensor]:
    """Per row its steps' (end, reward) -> ``step_rewards`` and ``step_ends`` ``[B, T]`` (float) on the token holding
    character ``end − 1`` of the row's text; steps ending outside the text are dropped."""
    mask = batch.response_mask.bool()
    rewards = torch.zeros(mask.shape, dtype=torch.float32)
    ends = torch.zeros(mask.shape, dtype=torch.float32)
    rows = [ids[real].tolist() for ids, real in zip(batch.responses, mask)]
    for b, (row_steps, char_ends) in enumerate(zip(steps, token_char_ends(tokenizer, rows, batch.texts))):
        for end, reward in row_steps:
            t = bisect_left(char_ends, end)  # the first token whose text reaches past character end - 1
            if end <= 0 or t >= len(char_ends):
                continue
            rewards[b, t] = min(rewards[b, t].item(), reward) if ends[b, t] else reward
            ends[b, t] = 1.0
    device = batch.responses.device
    return {"step_rewards": rewards.to(device), "step_ends": ends.to(device)}


def token_char_ends(tokenizer, rows: list[list[int]], texts: list[str]) -> list[list[int]]:
    """For each row of token ids, the length of its text after each token: ``len(decode(ids[: t + 1]))``.

    Fast path: the tokens decoded one by one, when they join to the row's text (character and most byte-level
    tokenizers); else (SentencePiece's leading spaces, a character split over byte tokens) every prefix decoded.
    Special tokens (EOS) add nothing, as in ``Rollout.texts``.
    """
    singles = tokenizer.batch_decode([[i] for row in rows for i in row], skip_special_tokens=True)
    out, start = [], 0
    for row, text in zip(rows, texts):
        pieces, start = singles[start : start + len(row)], start + len(row)
        if "".join(pieces) == text:
            out.append(list(accumulate(map(len, pieces))))
        else:
            prefixes = tokenizer.batch_decode([row[: n + 1] for n in range(len(row))], skip_special_tokens=True)
            out.append([len(p) for p in prefixes])
    return out


def step_metrics(batch: Rollout) -> dict[str, float]:
    """``train/steps_per_answer`` and ``train/step_accuracy`` (mean step reward) of a batch with step annotations."""
    if "step_ends" not in batch.annotations:
        return {}
    ends = batch.annotations["step_ends"].bool() & batch.response_mask.bool()
    rewards = batch.annotations["step_rewards"][ends]
    return {
        "train/steps_per_answer": ends.sum(1).float().mean().item(),
        "train/step_accuracy": rewards.mean().item() if rewards.numel() else 0.0,
    }


def spo_values(cfg, parts, batch: Rollout, problems: list) -> dict[str, float]:
    """SPO-chain's stage on ``batch``: adds ``token_probs``, ``cuts``, ``cut_values`` (``[B, T]``) -> its metrics.

    The probabilities are the trainer's (``Engine.logp`` at the rollout temperature), as the reference reads them
    from its actor. A cutpoint before token t continues the prompt plus the row's first t response tokens (t = 0:
    the prompt alone); its continuations may run to ``max_new_tokens − t`` tokens.
    """
    started = time.perf_counter()
    rollout, settings, engine = cfg.rollout, cfg.rollout.spo, parts.engine
    threshold = parts.components["advantage"].hparams["prob_threshold"]
    probs = engine.logp(batch, rollout.temperature).exp() * batch.response_mask
    cuts = spo_cutpoints(probs, batch.response_mask, prob_threshold=threshold, interval=settings.cutpoint_interval)
    rows, starts = (x.tolist() for x in cuts.nonzero(as_tuple=True))
    n, budget = settings.continuations, rollout.max_new_tokens
    responses = batch.responses.tolist()  # once: a GPU tensor is not read a cutpoint at a time
    prefixes = repeated([responses[r][:t] for r, t in zip(rows, starts)], n)
    with engine.sampling():  # every process enters it (FSDP gathers the policy), even with nothing to continue
        continued = None
        if prefixes:
            continued = parts.sampler.generate(
                parts.models.policy,
                [problems[r].prompt for r in repeated(rows, n)],
                temperature=rollout.temperature,
                max_new_tokens=budget - min(starts),
                prefixes=prefixes,
            )
    values = torch.zeros_like(probs)
    tokens = 0
    if continued is not None:
        rewards, tokens = continuation_rewards(
            parts, continued, prefixes, repeated(rows, n), problems, budget, settings
        )
        values[rows, starts] = rewards.to(values).view(-1, n).mean(1)
    batch.annotations.update(token_probs=probs, cuts=cuts.float(), cut_values=values)
    return {
        "train/spo_cutpoints": float(len(rows)),
        "train/spo_continuations": float(len(prefixes)),
        "perf/spo_tokens": float(tokens),
        "perf/spo_s": time.perf_counter() - started,
    }


def continuation_rewards(parts, continued: Rollout, prefixes, rows, problems, budget: int, settings):
    """The task's reward of each prefix + continuation, ``settings.unfinished_reward`` for one that reaches
    ``budget`` response tokens without EOS -> (rewards [M], tokens generated within the budgets)."""
    tokenizer = parts.models.tokenizer
    lengths = continued.response_mask.sum(1).long().tolist()
    texts, finished, tokens = [], [], 0
    for ids, length, prefix in zip(continued.responses.tolist(), lengths, prefixes):
        room = budget - len(prefix)
        kept = ids[: min(length, room)]
        tokens += len(kept)
        finished.append(bool(kept) and kept[-1] == tokenizer.eos_token_id)
        texts.append(tokenizer.decode(prefix + kept, skip_special_tokens=True))
    scores = parts.task.score_batch(texts, [problems[r] for r in rows])
    return torch.tensor([s if done else settings.unfinished_reward for s, done in zip(scores, finished)]), tokens


def repeated(items: list, n: int) -> list:
    """Each item ``n`` times in a row: ``[a, b]``, 2 -> ``[a, a, b, b]``."""
    return [x for x in items for _ in range(n)]
