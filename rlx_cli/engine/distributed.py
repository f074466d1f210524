"""Data parallelism over processes: ``rlx train launcher=torchrun`` or ``torchrun -m rlx_cli train ...``.

One process is the reference: N processes compute the same update from the same global batch (to float
rounding), each doing 1/N of the sampling and of the forward and backward passes.

1. Every process starts from rank 0's weights (broadcast once); each samples a step from a random stream of its
   own, seeded by the seed, its rank and the step (``sampling_stream``). ``trainer.strategy`` decides what each
   process holds (``sharding.py``): whole replicas (``ddp``), replicas with sharded AdamW states (``zero1``), or FSDP2
   shards (``fsdp``).
2. Sampling: each process samples a contiguous block of the step's prompts, whole groups (a group baseline
   needs its whole group), and scores them. ``gather_samples`` all-gathers the rollouts in rank order into
   the batch one process would have sampled for those prompts: same rows, order and padding.
3. Old/reference log-probs and values: each process runs its own rows; ``gather`` joins the results.
4. Token rewards, λ, advantages, whitening, reward shaping: the one-process code on the whole batch, on
   every process (elementwise work, cheap), so batch statistics are global without any special care.
5. The update: one minibatch permutation, rank 0's, broadcast; each minibatch is cut into N contiguous
   slices, one per process, and each slice into micro-batches (``rlx_cli/loops/update.py``). ``loss_agg`` divides a
   sum over the minibatch by a count D (tokens, rows or B·T); each micro-batch's loss, divided by its own D_m,
   is scaled by D_m / ΣD (ΣD over the whole minibatch of every process). The scaled losses add up to the
   minibatch's loss, and ``sum_gradients`` (all-reduce, sum) before clipping gives every process the
   one-process gradient. (DDP averages gradients instead; there each loss is scaled by N·D_r / ΣD, the usual
   normalisation by the global token count.) Value pretraining takes no gathering: each process updates on
   its own samples, weighted the same way (``seq_mean_token_sum_norm`` then counts each process's own width T).
6. The NaN guard and stop signals are agreed on (``all_true``, ``first_signal``): every process steps,
   skips or stops together. Metrics are share-weighted sums over processes (exact for the losses, a
   weighted mean for fractions and ratios); evaluation prompts are sharded and the correct answers summed.
   Rank 0 alone tracks to MLflow and writes checkpoints and the final model.

Why not the ``DistributedDataParallel`` wrapper: the policy is also the sampler (``generate``), its own
reference (LoRA adapters disabled) and, with LoRA, the base of the critic's adapter, whose forward does not
go through the policy's ``forward``; one explicit all-reduce of each optimizer's gradients covers all of
them the same way (DDP would also overlap it with the backward pass, which matters little at this size).
FSDP2 needs no lock-step sampling either: ``sharding.gathered`` unshards the policy once before ``generate``.

The backend is gloo on the CPU; with CUDA, NCCL for GPU tensors and gloo for the CPU ones (texts, metrics),
each process on the GPU of its ``LOCAL_RANK``. Without ``torchrun`` (WORLD_SIZE unset or 1) every
function here is the identity and a run is exactly the one-process run.
"""

from __future__ import annotations

import atexit
import os
from contextlib import contextmanager
from dataclasses import fields

import torch
import torch.distributed as dist
from torch import Tensor

from rlx_cli.engine.batch import Rollout


def size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if size() > 1 else 0


def is_main() -> bool:
    return rank() == 0


def start() -> None:
    """Join torchrun's process group (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); nothing without torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():  # NCCL for GPU tensors, gloo for the CPU ones (texts, metrics)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("cpu:gloo,cuda:nccl")
        else:
            dist.init_process_group("gloo")
        atexit.register(dist.destroy_process_group)


def shard(items: list) -> list:
    """This process's contiguous block of ``items`` (blocks differ in length by at most one)."""
    n, r, w = len(items), rank(), size()
    return items[n * r // w : n * (r + 1) // w]


def broadcast_weights(*modules) -> None:
    """Rank 0's trainable parameters to every process (all start from the same replica)."""
    if size() == 1:
        return
    with torch.no_grad():
        for module in filter(None, modules):
            for p in module.parameters():
                if p.requires_grad:
                    dist.broadcast(p.data, 0)


EVALUATION_STREAM = -(2**40)  # in the place of a step: no run's step or value-pretraining step is this


@contextmanager
def sampling_stream(seed: int, step: int):
    """Inside it, this process draws from the random stream of (seed, rank, step) alone; outside it the stream is
    left as it was (the update's minibatch permutations, which a checkpoint holds). So a resumed run, and a sampler
    process of its own (``rollout.overlap``), draw each step what the uninterrupted sequential run drew."""
    with torch.random.fork_rng():
        torch.manual_seed(hash((seed, rank(), step)) % 2**63)
        yield


def seed_evaluation(seed: int, block: int) -> None:
    """The random stream of block ``block`` of the evaluation's prompts, a function of (seed, block) alone: every
    evaluation of every run with this seed draws it, whatever the run drew before (a critic's start, value
    pretraining) and however many processes share the prompts, so runs that share a seed and their weights sample the
    same answers, and later evaluations differ by what the policies learned. Call it inside ``fork_rng``."""
    torch.manual_seed(hash((seed, block, EVALUATION_STREAM)) % 2**63)


def gather_list(x: Tensor) -> list[Tensor]:
    """Every process's ``x`` (any shape, the same dtype and number of dims), in rank order."""
    if size() == 1:
        return [x]
    shape = torch.tensor(x.shape)
    shapes = [torch.empty_like(shape) for _ in range(size())]
    dist.all_gather(shapes, shape)
    padded = x.new_zeros(torch.stack(shapes).amax(0).tolist())
    padded[tuple(slice(0, n) for n in x.shape)] = x
    parts = [torch.empty_like(padded) for _ in range(size())]
    dist.all_gather(parts, padded)
    return [part[tuple(slice(0, n) for n in s.tolist())] for part, s in zip(parts, shapes)]


def gather(x: Tensor | None) -> Tensor | None:
    """Rows of every process in rank order: ``[B_r, ...]`` -> ``[ΣB_r, ...]`` (None stays None)."""
    return x if x is None or size() == 1 else torch.cat(gather_list(x))


def gather_texts(texts: list[str]) -> list[list[str]]:
    """Every process's list of strings, in rank order (sent as UTF-8 bytes and lengths)."""
    encoded = [t.encode() for t in texts]
    data = torch.tensor(list(b"".join(encoded)), dtype=torch.uint8)
    lengths = torch.tensor([len(b) for b in encoded], dtype=torch.long)
    out = []
    for part, sizes in zip(gather_list(data), gather_list(lengths)):
        flat = bytes(part.tolist())
        ends = sizes.cumsum(0).tolist()
        out.append([flat[a:b].decode() for a, b in zip([0, *ends[:-1]], ends)])
    return out


def gather_samples(batch: Rollout, scores: Tensor, group_index: Tensor, sampling: dict[str, float], pad_id: int):
    """This process's sampled groups -> the step's: (batch, scores [B], group_index [B], metrics, own rows).

    ``own`` is this process's part of the gathered ``batch`` (rows in the global layout); group ids are
    renumbered to stay distinct. Counts are summed; ``train/draws`` and ``perf/*`` times are the largest.
    """
    if size() == 1:
        return batch, scores, group_index, sampling, batch
    skip = ("texts", "annotations")
    present = [f.name for f in fields(Rollout) if f.name not in skip and getattr(batch, f.name) is not None]
    tensors = {name: gather_list(getattr(batch, name)) for name in present}  # sampler_logp: only from vLLM
    notes = {name: gather_list(x) for name, x in sorted(batch.annotations.items())}  # the same names everywhere
    texts = gather_texts(batch.texts)
    parts = [
        Rollout(
            **{k: v[r] for k, v in tensors.items()}, texts=texts[r], annotations={k: v[r] for k, v in notes.items()}
        )
        for r in range(size())
    ]
    whole = Rollout.concat(parts, pad_id)
    groups = gather_list(group_index)
    offsets = torch.tensor([0] + [int(g.max()) + 1 for g in groups[:-1]]).cumsum(0)
    counts = torch.stack(gather_list(torch.tensor([sampling[k] for k in sampling], dtype=torch.float64)))
    slowest = [k == "train/draws" or k.startswith("perf/") for k in sampling]
    metrics = {k: float(col.max() if top else col.sum()) for k, col, top in zip(sampling, counts.T, slowest)}
    start = sum(len(p.texts) for p in parts[: rank()])
    own = whole.select(torch.arange(start, start + len(batch.texts)))
    return whole, gather(scores), torch.cat([g + o for g, o in zip(groups, offsets)]), metrics, own


def minibatch_rows(count: int, minibatches: int) -> list[Tensor]:
    """This process's rows of each minibatch of a ``count``-row batch.

    One permutation (rank 0's draw, broadcast) cut into ``minibatches`` chunks as one process cuts it, each
    chunk then cut into one contiguous slice per process; fewer, larger chunks when a chunk would have fewer
    rows than there are processes.
    """
    perm = torch.randperm(count)
    if size() == 1:
        return list(perm.chunk(minibatches))
    dist.broadcast(perm, 0)
    chunks = perm.chunk(minibatches)
    while min(len(c) for c in chunks) < size():
        chunks = perm.chunk(len(chunks) - 1)
    return [c.tensor_split(size())[rank()] for c in chunks]


def sum_gradients(params: list[Tensor], scale: float = 1.0, bucket_elements: int = 2**24) -> None:
    """All-reduce (sum) the gradients of ``params`` in flat buckets, times ``scale``; a missing one counts as 0."""
    if size() == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket, elements = [], 0
    for p, following in zip(params, [*params[1:], None]):
        bucket.append(p)
        elements += p.numel()
        if following is None or following.dtype != p.dtype or elements >= bucket_elements:
            flat = torch.cat([q.grad.flatten() for q in bucket])
            dist.all_reduce(flat)
            for q, g in zip(bucket, flat.split([q.numel() for q in bucket])):
                q.grad.copy_(g.view_as(q) * scale)
            bucket, elements = [], 0


def all_true(flag: bool) -> bool:
    """True on every process if it is true on all of them."""
    if size() == 1:
        return flag
    value = torch.tensor(int(flag))
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value)


def first_signal(signum: int | None) -> int | None:
    """A stop signal any process received (the highest number), so that all stop after the same step."""
    if size() == 1:
        return signum
    value = torch.tensor(signum or 0)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value) or None


def total(x: float) -> float:
    """Σ of ``x`` over processes."""
    if size() == 1:
        return x
    value = torch.tensor(float(x), dtype=torch.float64)
    dist.all_reduce(value)
    return float(value)


def largest(x: int) -> int:
    """The largest ``x`` over processes."""
    if size() == 1:
        return x
    value = torch.tensor(x)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value)


def sum_rows(x: Tensor) -> Tensor:
    """Σ over processes of ``x`` (each process's rows filled, the others' 0: the whole tensor on every process)."""
    if size() == 1:
        return x
    x = x.clone()
    dist.all_reduce(x)
    return x


def combine(metrics: dict[str, float]) -> dict[str, float]:
    """Σ over processes of each metric (each process's value already weighted by its ``share``); the largest
    value of a ``*_max`` metric."""
    if size() == 1:
        return metrics
    values = torch.tensor(list(metrics.values()), dtype=torch.float64)
    maxima = values.clone()
    dist.all_reduce(values)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
    return {k: (m if k.endswith("_max") else v) for k, v, m in zip(metrics, values.tolist(), maxima.tolist())}
