"""Rows whose advantages are all 0 skip the update's backward (``trainer.skip_zero_advantage``): the weights after
AdamW steps, the metrics and the log-probs the update hands back are those of the full backward; only rows whose
gradient is exactly 0 skip, and only where nothing else trains them."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny_llama

from components import registry
from rlx_cli.config.compose import compose, job_config
from rlx_cli.loops.build import components_of

ROWS = 16
ZERO_ROWS = torch.arange(ROWS) % 3 == 0  # rows 0, 3, ..., 15: a group whose answers all scored alike
# every policy loss registered advantage_weighted (whose rows without advantage may skip their backward), and the rest
LOSSES = registry.names("policy_loss")
ADVANTAGE_WEIGHTED = [name for name in LOSSES if registry.advantage_weighted("policy_loss", name)]
OTHER_LOSSES = [name for name in LOSSES if name not in ADVANTAGE_WEIGHTED]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"), layers=2, heads=2, head_dim=16)


def two_updates(model_dir, overrides: list[str], skip: bool) -> dict:
    """Two ``update_step`` calls with the run's own AdamW on one sampled batch: advantages with ZERO_ROWS at 0,
    then all 0 (the step runs on AdamW's moments alone) -> weights, gradients, metrics, log-probs, backwards, trained
    tokens."""
    from rlx_cli.loops.build import build
    from rlx_cli.loops.checkpoint import TrainState
    from rlx_cli.loops.progress import Progress
    from rlx_cli.loops.update import UpdateBatch, update_step

    settings = ["model=hf", f"model.path={model_dir}", "trainer.threads=1", "trainer.minibatches=1",
                "trainer.micro_batch_tokens=64", "trainer.lr=1e-3", "trainer.warmup_steps=0",
                f"trainer.skip_zero_advantage={skip}"]  # fmt: skip
    cfg = job_config(compose([*settings, *overrides]))
    parts = build(cfg, Progress(silent=True))
    for group in parts.policy_optimizer.param_groups:  # AdamW's first step is lr·sign(g) where |g| >> eps: at a g
        group["eps"] = 1e-3  # of rounding's size a sign flip would move a weight by lr; a larger eps keeps it smooth
    torch.manual_seed(0)
    prompts = [f"{i % 9 + 1},{i % 7 + 2}:" for i in range(ROWS)]
    with parts.engine.sampling():
        batch = parts.sampler.generate(parts.models.policy, prompts, temperature=1.0, max_new_tokens=10)
    mask = batch.response_mask
    noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    backwards = []
    backward = parts.engine.backward
    parts.engine.backward = lambda objective: (backwards.append(1), backward(objective))
    out = {"metrics": [], "logp": [], "weights": [], "grads": []}
    step_gradients = parts.engine.step_gradients

    def kept(optimizer, params, max_norm):  # each update's gradients, as the optimizer is about to get them
        out["grads"].append(
            {n: p.grad.clone() for n, p in parts.models.policy.named_parameters() if p.grad is not None}
        )
        return step_gradients(optimizer, params, max_norm)

    parts.engine.step_gradients = kept
    state, positive = TrainState(), torch.zeros(ROWS, dtype=torch.bool)
    for advantages in (noise * mask * ~ZERO_ROWS.unsqueeze(1), torch.zeros_like(mask)):
        metrics, logp = update_step(cfg, parts, state, 1, UpdateBatch(batch, advantages, positive))
        out["metrics"].append(metrics)
        out["logp"].append(logp)
        trainable = parts.models.policy.named_parameters()
        out["weights"].append({n: p.detach().clone() for n, p in trainable if p.requires_grad})
    return {**out, "backwards": len(backwards), "trained": state.compute["train_tokens"],
            "tokens": float(mask.sum()), "zero_tokens": float(mask[ZERO_ROWS].sum())}  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [["algo=grpo", f"policy_loss={name}"] for name in ADVANTAGE_WEIGHTED] + [["algo=grpo", "model.finetune=lora"]],
    ids=lambda o: " ".join(o),
)
def test_skipping_the_backward_of_rows_without_advantage_changes_nothing_but_the_work(model_dir, overrides):
    full, skipped = two_updates(model_dir, overrides, skip=False), two_updates(model_dir, overrides, skip=True)
    assert skipped["backwards"] < full["backwards"]
    assert skipped["trained"] == full["tokens"] - full["zero_tokens"]  # the second update ran no backward
    assert full["trained"] == 2 * full["tokens"]
    first, second = skipped["weights"]
    assert max((second[n] - w).abs().max() for n, w in first.items()) > 1e-4  # AdamW moved on its moments alone
    for theirs, ours in zip(full["grads"], skipped["grads"]):
        for name, grad in theirs.items():  # summed in another order when rows skip: float rounding apart
            assert torch.allclose(ours[name], grad, rtol=0, atol=1e-6 * float(grad.abs().max())), name
    for theirs, ours in zip(full["weights"], skipped["weights"]):
        for name, weight in theirs.items():
            assert torch.allclose(ours[name], weight, rtol=0, atol=1e-6), name
    for theirs, ours in zip(full["metrics"], skipped["metrics"]):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for theirs, ours in zip(full["logp"], skipped["logp"]):
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-6)


ADVANTAGES = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # row 2's 2.0 is padding


def forward_only(overrides: list[str]):
    from rlx_cli.loops.objective import forward_only_rows

    cfg = compose(overrides)
    return forward_only_rows(cfg, components_of(cfg), ADVANTAGES, MASK)


@pytest.mark.parametrize("algo", ["grpo", "dapo", "rloo", "reinforce_pp", "cispo", "gspo", "gmpo", "sapo", "ppo"])
def test_rows_whose_real_tokens_have_no_advantage_run_forward_only(algo):
    assert forward_only([f"algo={algo}"]).tolist() == [True, False, True, True]  # a row without real tokens too


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.skip_zero_advantage=false"],
        ["policy_loss.entropy_coef=0.01"],
        ["kl=estimate", "kl.placement=loss", "kl.coef=0.1"],
        ["lm_loss=positive_nll", "lm_loss.coef=0.5"],
        ["token_filter=high_entropy"],
        ["token_filter=low_probability"],
        ["algo=clip_cov"],
        ["algo=kl_cov"],
        ["algo=vapo"],  # its LM loss on positive samples
        *[[f"policy_loss={name}"] for name in OTHER_LOSSES],  # not registered advantage_weighted: none among them
    ],
    ids=lambda o: " ".join(o),
)
def test_no_row_is_forward_only_where_a_row_trains_without_advantage(overrides):
    assert forward_only(["algo=grpo", *overrides]) is None
