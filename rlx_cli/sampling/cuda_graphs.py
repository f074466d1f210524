"""``rollout.cuda_graphs``: ``rollout=fast``'s decode step captured in a CUDA graph and replayed.

A decode step of a 28-layer model is about 1,400 kernel launches from Python; at 256 rows on an H200 it took 26-77 ms,
bound by the launches, not by the card (docs/benchmarks.md). A CUDA graph records the step's kernels once and replays
them with one launch. A replay reuses the recorded addresses and shapes, so the step runs in static form
(``fast_rollout.Cache.make_static``: the cache's column in a device tensor, attention over the whole width with the
columns not yet written masked) over a bucket of rows, a power of two (``bucket``). A row that stops stays in its
bucket, masked out of the answers; when the going rows fit the next bucket down they move to the front and that
bucket's step is captured. Buckets only shrink within a decode loop, so ``GraphedStep`` holds one graph at a time,
and it goes with the loop's cache.

Off CUDA the same static steps run uncaptured (the tests check the buckets and the static form on the CPU against the
eager loop): only ``GraphedStep``'s capture and replay need a GPU (tests/test_cuda_graphs.py, skipped without one).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def enabled(setting: str | bool, device: torch.device) -> bool:
    """``rollout.cuda_graphs`` on ``device``: ``auto`` is on CUDA only."""
    return setting is True or (setting == "auto" and device.type == "cuda")


def bucket(going: int, top: int) -> int:
    """The rows a static decode step runs for ``going`` rows still going in a loop of ``top``: the smallest power of
    two that holds them, at most ``top``."""
    return min(top, 1 << max(going - 1, 0).bit_length())


class GraphedStep:
    """``step`` (tokens [b] -> logits [b, V], for each ``b`` fixed shapes and addresses and no host sync) captured
    in a CUDA graph the first time it gets ``b`` rows, replayed after; ``rows``: the most rows it gets.

    The logits returned by a replay live in the graph's memory, overwritten by the next replay: read them first."""

    def __init__(self, step: Callable[[Tensor], Tensor], rows: int, device: torch.device):
        self.step = step
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)  # the graphs' input
        self.rows, self.graph, self.logits = 0, None, None

    def __call__(self, tokens: Tensor) -> Tensor:
        """``tokens`` [b] -> logits [b, V]."""
        b = tokens.shape[0]
        self.tokens[:b].copy_(tokens)
        if b != self.rows:
            return self.capture(b)
        self.graph.replay()
        return self.logits

    def capture(self, b: int) -> Tensor:
        """This step run for real on a side stream (the warm-up capture needs), then recorded for ``b`` rows (a
        capture runs nothing) -> the warm-up's logits."""
        self.rows, self.graph, self.logits = 0, None, None  # the bigger bucket's graph and memory go first
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = self.step(self.tokens[:b])
        torch.cuda.current_stream().wait_stream(side)
        logits.record_stream(torch.cuda.current_stream())  # read on this stream: its memory not reused before
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads' CUDA calls are theirs
            self.logits = self.step(self.tokens[:b])
        self.rows, self.graph = b, graph
        return logits
