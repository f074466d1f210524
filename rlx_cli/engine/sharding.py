"""``trainer.strategy`` over N processes: ``ddp`` (whole replicas), ``zero1`` (AdamW states sharded), ``fsdp``.

- ``ddp``: every process holds the policy, reference, critic and AdamW states whole; gradients are summed with
  one all-reduce per optimizer (``distributed.sum_gradients``). Memory per process for full fine-tuning with
  float32 masters: 16 bytes a parameter.
- ``zero1``: the same replicas and gradient sum; ``ZeroRedundancyOptimizer`` keeps 1/N of the AdamW states on each
  process, steps its part and broadcasts the new weights: 8 + 8/N bytes a parameter.
- ``fsdp``: FSDP2 ``fully_shard`` on every decoder layer and on each model's root (the ``Scorer`` of the policy and
  of a full-model reference, the ``Critic``): 16/N bytes a parameter, plus the weights gathered during a forward.
  FSDP averages gradients over processes, so ``Engine.backward`` scales the loss by N; parameters outside the
  sharded modules (the LoRA critic's value head) are summed here and divided by N. Sampling needs no lock-step:
  ``gathered`` unshards every module once (and keeps it unsharded across forwards), so each process runs
  ``generate`` on its own, then shards again.

Checkpoints and ``final/`` stay whole safetensors: ``full_tensors`` gathers every weight and ``full_optimizer_state``
every AdamW state (collectives: every process calls them); ``load_tensors`` and ``load_optimizer_state`` cut the
whole tensors back to each process's shard. One process runs every strategy as ``ddp``.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from rlx_cli.engine import distributed


def shard(models) -> None:
    """FSDP2 over the policy's ``Scorer``, a full-model reference's and the ``Critic``, each decoder layer its own
    unit; then one forward of each root, so that FSDP takes it for the root (a first ``generate`` would not)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from rlx_cli.engine.logprobs import causal_lm
    from rlx_cli.engine.models import Critic

    policy_dtype = models.compute_dtype or next(models.policy.parameters()).dtype
    mixed = MixedPrecisionPolicy(param_dtype=policy_dtype, reduce_dtype=torch.float32)
    roots = [models.scorer] + ([models.reference_scorer] if models.reference is not None else [])
    bodies = [causal_lm(root.lm) for root in roots]
    if isinstance(models.critic, Critic):
        roots.append(models.critic)
        bodies.append(models.critic.body)
    for root, body in zip(roots, bodies):
        layer_types = set(getattr(body, "_no_split_modules", None) or [])
        for module in body.modules():
            if type(module).__name__ in layer_types:
                fully_shard(module, mp_policy=mixed)
        if isinstance(root, Critic):  # the value head computes in its own dtype (float32 unless bf16-true)
            fully_shard(root.head, mp_policy=MixedPrecisionPolicy())
        fully_shard(root, mp_policy=mixed)
    warm_up(models, roots)


@torch.no_grad()
def warm_up(models, roots: list[nn.Module]) -> None:
    from rlx_cli.engine.batch import Rollout

    one = torch.zeros(1, 2, dtype=torch.long, device=models.device)
    batch = Rollout(one, torch.ones_like(one), torch.arange(2, device=one.device)[None], one[:, 1:],
                    torch.ones(1, 1, device=one.device), [""])  # fmt: skip
    for root in roots:
        root(batch)
        root.reshard()  # a root stays unsharded after its forward; optimizers must see the sharded parameters


def fsdp_modules(root: nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(root: nn.Module):
    """Every FSDP unit under ``root`` unsharded once and kept so across forwards; resharded after."""
    units = fsdp_modules(root)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(unit is not root, recurse=False)  # a root stays unsharded (FSDP's way)
            unit.reshard()


def make_optimizer(params: list, lr: float, trainer, strategy: str) -> torch.optim.Optimizer:
    """AdamW, or under ``zero1`` with several processes AdamW sharded by ``ZeroRedundancyOptimizer``."""
    options = dict(lr=lr, betas=tuple(trainer.betas), weight_decay=trainer.weight_decay)
    if strategy == "zero1" and distributed.size() > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **options)
    return torch.optim.AdamW(params, **options)


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def reduce_gradients(optimizer: torch.optim.Optimizer, strategy: str) -> None:
    """The one-process gradient on every process: FSDP has reduced its shards; everything else is summed."""
    params = optimizer_params(optimizer)
    if strategy == "fsdp":
        distributed.sum_gradients([p for p in params if not isinstance(p, DTensor)], scale=1 / distributed.size())
    else:
        distributed.sum_gradients(params)


def clip_gradients(params: list[Tensor], max_norm: float) -> Tensor:
    """``clip_grad_norm_`` that also takes a mix of sharded (DTensor) and whole parameters -> the total norm."""
    grads = [p.grad for p in params if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    sharded = sum(g.to_local().float().pow(2).sum() for g in grads if isinstance(g, DTensor))
    dist.all_reduce(sharded)
    whole = sum((g.float().pow(2).sum() for g in grads if not isinstance(g, DTensor)), torch.zeros(()))
    total = (sharded + whole.to(sharded.device)).sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        (g.to_local() if isinstance(g, DTensor) else g).mul_(scale.to(g.device))
    return total


def full_tensors(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Whole CPU copies of ``tensors`` (sharded ones gathered: a collective, every process calls it)."""
    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().contiguous()
        for name, t in tensors.items()
    }


def load_tensors(targets: dict[str, Tensor], saved: dict[str, Tensor]) -> None:
    """Copy whole ``saved`` tensors into ``targets``, each sharded one receiving its own shard."""
    with torch.no_grad():
        for name, target in targets.items():
            target.copy_(like(saved[name], target))


def like(whole: Tensor, target: Tensor) -> Tensor:
    """``whole`` on ``target``'s device and dtype, cut to ``target``'s shard when it is sharded."""
    whole = whole.to(device=target.device, dtype=target.dtype)
    if isinstance(target, DTensor):
        return distribute_tensor(whole, target.device_mesh, target.placements, src_data_rank=None)
    return whole


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict | None:
    """The optimizer's whole ``state_dict`` (a collective); under ZeRO only rank 0 gets it (None elsewhere)."""
    if hasattr(optimizer, "consolidate_state_dict"):  # ZeroRedundancyOptimizer
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if distributed.is_main() else None
    state = optimizer.state_dict()
    return {**state, "state": {i: full_tensors(s) for i, s in state["state"].items()}}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a whole ``state_dict``; AdamW states of sharded parameters are cut to this process's shard."""
    params = optimizer_params(optimizer)
    if any(isinstance(p, DTensor) for p in params):
        state = {
            **state,
            "state": {
                i: {k: like(v, params[int(i)]) if v.shape == params[int(i)].shape else v for k, v in s.items()}
                for i, s in state["state"].items()
            },
        }
    optimizer.load_state_dict(state)
