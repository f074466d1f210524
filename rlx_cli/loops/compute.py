"""What a run has spent so far, logged at every step and evaluation, so that arms compare at equal compute.

- ``perf/samples``: answers generated for training: every draw of dynamic sampling, SPO's continuations, RFT's
  one sampling pass, the critic's pretraining batches (evaluation's answers are not counted);
- ``perf/tokens``: the response tokens of those answers;
- ``perf/train_tokens``: response tokens through an update's forward and backward, once per epoch (the policy's
  and the critic's pretraining; a pair counts both its answers; rows that skip the backward for want of any
  advantage, ``trainer.skip_zero_advantage``, do not count);
- ``perf/wall_s``: seconds inside the training loop (pretraining and evaluations included), summed over resumes.

The counts live in ``TrainState.compute`` and so in every checkpoint: a resumed run goes on counting.
"""

from __future__ import annotations

import time

SAMPLED = "train/sampled"  # a sampling stage's answers: summed over processes (distributed.gather_samples)
SAMPLED_TOKENS = "train/sampled_tokens"
KEYS = ("samples", "tokens", "train_tokens", "wall_s")


def count_sampled(counts: dict[str, float], metrics: dict[str, float]) -> None:
    """A sampling stage's ``metrics`` (SAMPLED, SAMPLED_TOKENS) added to a run's ``counts`` (TrainState.compute)."""
    counts["samples"] = counts.get("samples", 0.0) + metrics.get(SAMPLED, 0.0)
    counts["tokens"] = counts.get("tokens", 0.0) + metrics.get(SAMPLED_TOKENS, 0.0)


def count_trained(counts: dict[str, float], tokens: float) -> None:
    """``tokens`` response tokens through one update's forward and backward, added to ``counts``."""
    counts["train_tokens"] = counts.get("train_tokens", 0.0) + float(tokens)


class Clock:
    """The ``perf/*`` compute metrics of a run's ``counts`` (its TrainState.compute); wall time runs from the Clock's
    creation on top of what ``counts`` carried (a resumed run's time before it stopped)."""

    def __init__(self, counts: dict[str, float]):
        self.counts, self.carried, self.started = counts, counts.get("wall_s", 0.0), time.perf_counter()

    def metrics(self) -> dict[str, float]:
        """-> perf/samples, perf/tokens, perf/train_tokens, perf/wall_s, cumulative."""
        self.counts["wall_s"] = self.carried + time.perf_counter() - self.started
        return {f"perf/{key}": self.counts.get(key, 0.0) for key in KEYS}
