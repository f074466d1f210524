"""Data parallelism: two gloo processes on 127.0.0.1 compute what one process computes.

The update test runs the loop's own ``update_step`` on one fixed global batch in one process and in two
(each its slice of every minibatch) and compares losses and every trainable weight; the end-to-end test
runs ``rlx train launcher=torchrun``.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
from conftest import SHORT, mlflow_runs, rlx, save_tiny_llama
from safetensors.torch import load_file, save_file

# (name, overrides): every loss_agg mode; full and LoRA; no critic, the LoRA critic and the full-model one
CASES = [
    ("token_mean", ["model.finetune=full", "kl=estimate", "kl.placement=loss", "kl.coef=0.1"]),
    ("seq_mean_token_mean", ["model.finetune=lora", "policy_loss.entropy_coef=0.01"]),
    ("seq_mean_token_sum", ["algo=ppo", "model.finetune=lora", "lm_loss=positive_nll", "lm_loss.coef=0.5"]),
    ("seq_mean_token_sum_norm", ["algo=ppo", "model.finetune=full", "trainer.epochs=2"]),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random tiny Llama with the character tokenizer, saved like a user's checkpoint."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"), layers=2, heads=2, head_dim=16)


def one_update(model_dir, mode: str, overrides: list[str]):
    """``update_step`` on a fixed batch of 16 rows, 2 minibatches -> (metrics, trainable weights after it, the
    largest change of a policy weight)."""
    from rlx_cli.build import build
    from rlx_cli.checkpoint import TrainState
    from rlx_cli.compose import compose, job_config
    from rlx_cli.loop import update_step
    from rlx_cli.models import response_logp
    from rlx_cli.progress import Progress

    cfg = job_config(
        compose(["model=hf", f"model.path={model_dir}", "trainer.threads=1", f"loss_agg.mode={mode}", *overrides])
    )
    parts = build(cfg, Progress(silent=True))
    models = parts.models
    # SGD at lr 1: a weight moves by its gradient, so any difference in the gradients shows (AdamW's first steps
    # move each weight by about lr·sign(gradient), whatever the gradient's size)
    parts.policy_optimizer = torch.optim.SGD(parts.policy_optimizer.param_groups[0]["params"], lr=1.0)
    if parts.critic_optimizer is not None:
        parts.critic_optimizer = torch.optim.SGD(parts.critic_optimizer.param_groups[0]["params"], lr=1.0)
    torch.manual_seed(0)  # the same batch in every process
    prompts = [f"{i % 9 + 1},{i % 7 + 2},{i % 5 + 3}:" for i in range(16)]
    batch = parts.sampler.generate(models.policy, prompts, temperature=1.0, max_new_tokens=12)
    mask = batch.response_mask
    with torch.no_grad():
        old_logp, _ = response_logp(models.policy, batch, 1.0)
        with models.reference_context():
            ref_logp, _ = response_logp(models.reference_model, batch, 1.0)
        values = models.critic(batch) if models.critic is not None else None
    noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    advantages = noise * mask
    returns = None if values is None else (values + noise.flip(0)) * mask
    positive = torch.arange(16) % 3 == 0
    before = {n: p.detach().clone() for n, p in models.policy.named_parameters() if p.requires_grad}
    torch.manual_seed(2)  # the minibatch permutation: rank 0's draw is one process's draw
    metrics = update_step(
        cfg, parts, TrainState(), 1, batch, old_logp, ref_logp, advantages, positive, values, returns, mode
    )
    weights = {n: p.detach().clone() for n, p in models.policy.named_parameters() if p.requires_grad}
    moved = max((w - before[n]).abs().max().item() for n, w in weights.items())
    assert moved > 1e-3  # the update moved the policy
    if models.critic is not None:
        weights.update({f"critic.{n}": p.detach().clone() for n, p in models.critic.state_dict().items()})
    return metrics, weights, moved


def check_gather_and_agreement() -> None:
    """``gather_samples`` rebuilds the one-process batch; the NaN-guard flag and stop signals are agreed on."""
    from rlx_cli import distributed
    from rlx_cli.base_model import char_tokenizer
    from rlx_cli.rollout import Rollout, position_ids

    def local(r: int) -> Rollout:  # rank r's samples: its own prompt and response widths
        prompt = torch.full((2, 3 + r), 4 + r)
        responses = torch.tensor([[5, 6, 2, 0, 0][: 3 + 2 * r], [7, 2, 0, 0, 0][: 3 + 2 * r]])
        mask = (torch.arange(3 + 2 * r) < torch.tensor([[3], [2]])).float()
        attention = torch.cat([torch.ones_like(prompt), mask.long()], 1)
        return Rollout(torch.cat([prompt, responses], 1), attention, position_ids(attention), responses, mask,
                       [f"text {r}a", f"text {r}b"])  # fmt: skip

    r = distributed.rank()
    sampling = {"train/groups": 1.0, "train/draws": 1.0 + r, "train/reward_errors": 0.0}
    mine = local(r)
    batch, scores, groups, metrics, own = distributed.gather_samples(
        mine, torch.tensor([1.0, 0.0]) + r, torch.tensor([0, 0]), sampling, char_tokenizer().pad_token_id
    )
    expected = Rollout.concat([local(0), local(1)], 0)
    for name in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name
    assert batch.texts == ["text 0a", "text 0b", "text 1a", "text 1b"]
    assert torch.equal(own.responses, expected.responses[2 * r : 2 * r + 2])
    assert scores.tolist() == [1.0, 0.0, 2.0, 1.0] and groups.tolist() == [0, 0, 1, 1]
    assert metrics == {"train/groups": 2.0, "train/draws": 2.0, "train/reward_errors": 0.0}
    assert distributed.all_true(r == 0) is False and distributed.all_true(True) is True
    assert distributed.first_signal(15 if r == 1 else None) == 15 and distributed.first_signal(None) is None


def worker(rank: int, port: int, model_dir, out_dir) -> None:
    """One of two processes, set up as torchrun sets them up."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    from rlx_cli import distributed

    distributed.start()
    check_gather_and_agreement()
    for mode, overrides in CASES:
        metrics, weights, _ = one_update(model_dir, mode, overrides)
        save_file(weights, str(out_dir / f"{mode}-{rank}.safetensors"))
        (out_dir / f"{mode}-{rank}.json").write_text(json.dumps(metrics))


def test_two_processes_update_like_one(model_dir, tmp_path):
    torch.multiprocessing.spawn(worker, args=(free_port(), model_dir, tmp_path), nprocs=2)
    for mode, overrides in CASES:
        metrics, weights, moved = one_update(model_dir, mode, overrides)
        for rank in (0, 1):
            theirs = load_file(tmp_path / f"{mode}-{rank}.safetensors")
            assert theirs.keys() == weights.keys()
            diff = max((theirs[k] - weights[k]).abs().max().item() for k in weights)
            assert diff < 1e-4, (mode, rank, diff)
            their_metrics = json.loads((tmp_path / f"{mode}-{rank}.json").read_text())
            loss_diff = abs(their_metrics["train/loss"] - metrics["train/loss"])
            print(f"{mode} rank {rank}: max |Δ weight| {diff:.1e} (the update moved weights by up to {moved:.1e}), "
                  f"|Δ train/loss| {loss_diff:.1e}")  # fmt: skip
            for key in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm", "train/value_loss"):
                if key in metrics:
                    assert their_metrics[key] == pytest.approx(metrics[key], abs=1e-4), (mode, key)


@pytest.mark.slow
def test_rlx_train_launcher_torchrun(workdir):
    """``launcher=torchrun``: two processes, one MLflow run, rank 0's checkpoint and final model."""
    out = rlx("train", "launcher=torchrun", *SHORT, "trainer.output_dir=out", cwd=workdir, env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("rlx train: done") == 1 and out.stderr.count("step 0:") == 1  # rank 0 speaks
    runs = mlflow_runs(workdir)
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED" and run["tags.rlx.processes"] == "2"
    for metric in ("train/reward", "train/loss", "train/grad_norm", "eval/accuracy", "perf/step_s"):
        assert f"metrics.{metric}" in runs.columns, metric
    assert (workdir / "out" / "final" / "model.safetensors").is_file()
    assert [p.name for p in (workdir / "out" / "checkpoints").iterdir()] == ["step-000003"]
    assert json.loads((workdir / "out" / "metrics.json").read_text())["train/groups"] == 4.0
