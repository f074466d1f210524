"""Micro-batches under one token budget, ``trainer.micro_batch_tokens``, for every forward and backward of a step.

A micro-batch holds at most ``budget`` tokens counted as rows × its own width (the longest real prompt plus the
longest real response among its rows), a strict cap; a row longer than the budget alone gets a micro-batch of its
own. Within the cap the rows are cut to cost least: in decreasing order of real length, into runs that minimise the
tokens computed (real and padding) plus ``MICRO_BATCH_COST`` tokens for each micro-batch (``plan``). Padding is
computed like any token: the default's 128 answers of 1 to 48 tokens were one micro-batch of 7,040 tokens (3,976
real) and are four of 4,326 cut by length. Each micro-batch is trimmed: prompt columns that are padding in every
row (on the left) and response columns that are padding in every row (on the right) are dropped; positions come
from the attention mask, so log-probs and values do not change. ``MicroBatch.rows`` keeps each row's index in the
batch, so results go back to their rows (``place``).

Losses over micro-batches stay exact (``loops/update.py``): each micro-batch's aggregated loss is weighted by its
own ``loss_agg.denominator`` over the whole minibatch's, computed once before the split on the untrimmed minibatch
(``seq_mean_token_sum_norm`` divides by B·T of the untrimmed width; summing trimmed widths would be wrong).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rlx_cli.engine.batch import Rollout

# What one more micro-batch costs, in tokens: its forward and backward launch the same kernels whatever their size.
# Of 96, 256 and 640, 256 gave the fastest update on the CPU (2 threads) on both the default and long_sums; on a
# GPU it is an estimate (a 1.5B model: ~20 µs of arithmetic a token against ~2,500 launches of ~5 µs, ~600 tokens).
MICRO_BATCH_COST = 256


@dataclass
class MicroBatch:
    rows: Tensor  # [b] long: the rows of the batch it holds, in its own order
    batch: Rollout  # those rows, trimmed to their own width
    padding: bool = False  # an empty stand-in: a forward that every process must run, with no real token
    forward_only: bool = False  # rows whose gradient is exactly 0: the update runs their forward only (metrics)

    @property
    def tokens(self) -> int:
        """Its size under the budget: rows x width."""
        return self.batch.input_ids.numel()

    @staticmethod
    def empty_like(mb: MicroBatch, forward_only: bool = False) -> MicroBatch:
        """One row of ``mb`` with no real response token: its loss is 0 and its gradients are zeros."""
        one = mb.batch.select(mb.rows.new_zeros(1))
        one.response_mask = torch.zeros_like(one.response_mask)
        return MicroBatch(mb.rows[:0], one, padding=True, forward_only=forward_only)


def plan(prompt_lengths: list[int], response_lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices per micro-batch, each holding at most ``budget`` tokens (rows × (longest prompt + longest
    response)), a row over the budget alone in its own: the rows in decreasing order of real length, cut into the
    runs of least total cost, a run's cost its tokens plus ``MICRO_BATCH_COST``.

    Dynamic programming over the sorted rows: ``best[k]`` the least cost of the first k, from every run that can
    end the k-th (at most budget / its real length rows, each row at least as long as it).
    """
    order = sorted(range(len(prompt_lengths)), key=lambda i: (-(prompt_lengths[i] + response_lengths[i]), i))
    prompts, responses = np.asarray(prompt_lengths)[order], np.asarray(response_lengths)[order]
    best, run_start = np.zeros(len(order) + 1), np.zeros(len(order) + 1, dtype=np.int64)
    for end in range(1, len(order) + 1):
        start = max(0, end - max(1, budget // int(prompts[end - 1] + responses[end - 1])))
        # the runs [end - 1, end), [end - 2, end), ... [start, end): their widths and tokens
        width = np.maximum.accumulate(prompts[start:end][::-1]) + np.maximum.accumulate(responses[start:end][::-1])
        tokens = width * np.arange(1, end - start + 1)
        cost = best[start:end][::-1] + tokens + MICRO_BATCH_COST
        cost[1:][tokens[1:] > budget] = np.inf  # one row is always allowed
        chosen = int(cost.argmin())  # the run of chosen + 1 rows
        best[end], run_start[end] = cost[chosen], end - 1 - chosen
    runs, end = [], len(order)
    while end:
        runs.append(order[run_start[end] : end])
        end = int(run_start[end])
    return runs[::-1]


def split(batch: Rollout, budget: int, forward_only: Tensor | None = None) -> list[MicroBatch]:
    """``batch`` as micro-batches of at most ``budget`` tokens each (see the module's docstring).

    ``forward_only`` ``[B]`` bool: rows whose gradient is exactly 0; they are planned apart, into micro-batches
    marked ``forward_only`` that come first (their forwards run before any backward: under FSDP2 a forward after the
    backward leaves the root unsharded, and the optimizer's step would miss what the next forward uses). One empty
    micro-batch with a backward stands in when every row is forward-only: the step still has its zero gradients, and
    AdamW moves on its moments as after a full backward."""
    prompt_lengths = batch.attention_mask[:, : batch.prompt_len].sum(1).tolist()
    response_lengths = batch.response_mask.sum(1).long().tolist()
    device = batch.input_ids.device
    kinds = [(list(range(len(prompt_lengths))), False)]
    if forward_only is not None:
        first, rest = forward_only.nonzero().flatten().tolist(), (~forward_only).nonzero().flatten().tolist()
        kinds = [(first, True), (rest, False)]
    micro = []
    for picked, kind in kinds:
        for run in plan([prompt_lengths[i] for i in picked], [response_lengths[i] for i in picked], budget):
            rows = torch.tensor([picked[i] for i in run], device=device)
            micro.append(MicroBatch(rows, trim(batch.select(rows)), forward_only=kind))
    if micro and all(mb.forward_only for mb in micro):
        micro.append(MicroBatch.empty_like(micro[0]))
    return micro


def trim(batch: Rollout) -> Rollout:
    """Drop the prompt columns that are padding in every row and the response columns after every row's end."""
    prompt_len = batch.prompt_len
    first = int(batch.attention_mask[:, :prompt_len].any(0).nonzero()[0])  # prompts end in a real token
    real_response = batch.response_mask.any(0)
    width = int(real_response.nonzero()[-1]) + 1 if real_response.any() else 1
    keep = slice(first, prompt_len + width)
    return Rollout(
        input_ids=batch.input_ids[:, keep],
        attention_mask=batch.attention_mask[:, keep],
        position_ids=batch.position_ids[:, keep],
        responses=batch.responses[:, :width],
        response_mask=batch.response_mask[:, :width],
        texts=batch.texts,
        sampler_logp=None if batch.sampler_logp is None else batch.sampler_logp[:, :width],
    )


def place(parts: list[Tensor], micro: list[MicroBatch], shape: tuple[int, int]) -> Tensor:
    """Per-micro-batch ``[b, t]`` results back into one ``[B, T]`` tensor in the batch's row order (0 elsewhere;
    a padding micro-batch's result is dropped)."""
    out = parts[0].new_zeros(shape)
    for part, mb in zip(parts, micro):
        if not mb.padding:
            out[mb.rows, : part.shape[1]] = part
    return out


def cut(x: Tensor | None, mb: MicroBatch) -> Tensor | None:
    """A ``[B, T]`` (or ``[B]``) tensor of the batch restricted to ``mb``'s rows and width."""
    if x is None:
        return None
    x = x[mb.rows]
    return x[:, : mb.batch.responses.shape[1]] if x.dim() == 2 else x
