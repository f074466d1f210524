"""A DPO update over micro-batches has the gradient of the whole minibatch's loss, whatever the token budget."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO, save_tiny_llama

from components import preference
from rlx_cli.config.compose import compose, job_config
from rlx_cli.loops.build import build
from rlx_cli.loops.preference_update import pair_update
from rlx_cli.loops.progress import Progress
from rlx_cli.sampling.pairs import Pair, pair_rollout, pairs_for_step

PAIRS = [
    Pair("3,4:", "3+4=7#7", "3+4=8#8"),
    Pair("12,9,5:", "12+9=21,21+5=26#26", "12+9=11#11"),
    Pair("2,2:", "2+2=4#4", "2+2=5,5+1=6,6+6=12#12"),
]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A tiny Llama, fully fine-tuned, whose policy is moved away from its reference (so that Δ ≠ 0)."""
    path = save_tiny_llama(tmp_path_factory.mktemp("policy") / "model", layers=2, heads=2, head_dim=16)
    overrides = ["algo=dpo", "model=hf", f"model.path={path}", "model.finetune=full", "task=pairs",
                 f"task.path={REPO / 'examples' / 'sums_pairs.jsonl'}", "trainer.grad_clip=0", "tracking=none",
                 "trainer.device=cpu", "trainer.precision=fp32"]  # fmt: skip
    built = build(job_config(compose(overrides)), Progress(silent=True))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in built.models.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    built.policy_optimizer.step = lambda: None  # the weights stay: the gradient is what is compared
    return built


@pytest.mark.parametrize("kind", ["sigmoid", "ipo"])
@pytest.mark.parametrize("budget", [1, 40, 100_000])  # one row per micro-batch; pairs split; all at once
def test_gradient_over_micro_batches_is_the_whole_minibatch_gradient(parts, kind, budget):
    parts.engine.budget = budget
    parts.components["preference"].hparams.update(kind=kind, beta=0.5)
    batch = pair_rollout(parts.sampler, PAIRS)
    params = [p for group in parts.policy_optimizer.param_groups for p in group["params"]]
    # by hand: one forward with gradients over the whole batch, the loss of preference.dpo, autograd
    x = preference.sequence_logp(parts.models.scorer(batch, 1.0)[0], batch.response_mask, kind=kind)
    with torch.no_grad():
        ref = preference.sequence_logp(parts.models.reference_scorer(batch, 1.0)[0], batch.response_mask, kind=kind)
    loss, metrics = preference.dpo(x[:3], x[3:], ref[:3], ref[3:], beta=0.5, kind=kind)
    expected = torch.autograd.grad(loss, params)
    cfg = job_config(compose(["trainer.grad_clip=0"]))
    got, stepped = pair_update(cfg, parts, 1, batch, 3.0)
    assert stepped and got["train/loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert got["train/rewards/margins"] == pytest.approx(metrics["rewards/margins"].item(), rel=1e-4, abs=1e-7)
    for p, e in zip(params, expected):
        assert torch.allclose(p.grad, e, atol=1e-6, rtol=1e-4)


def test_pairs_go_round_in_epochs_each_once_per_epoch():
    pairs = [Pair(str(i), "a", "b") for i in range(5)]
    seen = [p.prompt for step in (1, 2, 3, 4, 5) for p in pairs_for_step(pairs, 2, seed=0, step=step)]
    assert sorted(seen[:5]) == sorted(seen[5:10]) == list("01234") and seen[:5] != seen[5:10]
    assert pairs_for_step(pairs, 2, seed=0, step=3) == pairs_for_step(pairs, 2, seed=0, step=3)


def test_a_pair_batch_is_chosen_rows_then_rejected_rows_each_ended_by_eos(parts):
    batch = pair_rollout(parts.sampler, PAIRS[:2])
    tokenizer = parts.models.tokenizer
    assert batch.texts == ["3+4=7#7", "12+9=21,21+5=26#26", "3+4=8#8", "12+9=11#11"]
    lengths = batch.response_mask.sum(1).long()
    assert lengths.tolist() == [len(t) + 1 for t in batch.texts]  # one token a character, and EOS
    assert all(batch.responses[i, n - 1] == tokenizer.eos_token_id for i, n in enumerate(lengths.tolist()))
