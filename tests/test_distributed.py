"""Data parallelism and micro-batches: what one process computes on the whole batch, every other way computes too.

The update tests run the loop's own ``update_step`` on one fixed global batch: in one process on the whole batch
(the reference), in one process over small micro-batches, and in two gloo processes (each its slice of every
minibatch) under ``trainer.strategy`` ddp, zero1 and fsdp; they compare losses and every trainable weight after an
SGD step at lr 1 (a weight moves by its gradient, so any difference in the gradients shows). The end-to-end test
runs ``rlx train launcher=torchrun``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket

import pytest
import torch
from conftest import SHORT, mlflow_runs, rlx, save_tiny_llama
from safetensors.torch import load_file, save_file

# (name, loss_agg mode, overrides): every loss_agg mode; full and LoRA; no critic, the LoRA critic and the full-model
# one; KL in the loss, the entropy bonus, positive-sample NLL; then FSDP2 and ZeRO-1 on full (with and without rows
# that skip the backward), LoRA and VAPO's critic
CASES = [
    ("token_mean", "token_mean", ["model.finetune=full", "kl=estimate", "kl.placement=loss", "kl.coef=0.1"]),
    ("seq_mean_token_mean", "seq_mean_token_mean", ["model.finetune=lora", "policy_loss.entropy_coef=0.01"]),
    ("seq_mean_token_sum", "seq_mean_token_sum", ["algo=ppo", "model.finetune=lora", "lm_loss=positive_nll",
                                                  "lm_loss.coef=0.5"]),
    ("seq_mean_token_sum_norm", "seq_mean_token_sum_norm", ["algo=ppo", "model.finetune=full", "trainer.epochs=2"]),
    *[
        (f"{strategy}-{name}", "token_mean", [f"trainer.strategy={strategy}", *overrides])
        for strategy in ("fsdp", "zero1")
        for name, overrides in (
            ("full", ["model.finetune=full", "kl=estimate", "kl.placement=loss", "kl.coef=0.1"]),
            ("grpo", ["model.finetune=full"]),  # rows without advantage skip the backward (objective.forward_only_rows)
            ("lora", ["model.finetune=lora", "policy_loss.entropy_coef=0.01"]),
            ("vapo", ["algo=vapo", "model.finetune=full"]),
            ("vapo-lora", ["algo=vapo", "model.finetune=lora"]),
        )
    ],
]  # fmt: skip
MICRO = ["trainer.micro_batch_tokens=48"]  # 16 rows of about 7 + 12 tokens: micro-batches of 1 or 2 rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random tiny Llama with the character tokenizer, saved like a user's checkpoint."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"), layers=2, heads=2, head_dim=16)


def sgd(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """SGD at lr 1 over ``optimizer``'s parameters, sharded like it (ZeRO-1) or not: a weight moves by its
    gradient, so any difference in the gradients shows (AdamW's first steps move each weight by about
    lr·sign(gradient), whatever the gradient's size)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if hasattr(optimizer, "consolidate_state_dict"):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=1.0)
    return torch.optim.SGD(params, lr=1.0)


def one_update(model_dir, mode: str, overrides: list[str]):
    """``update_step`` on a fixed batch of 16 rows, 2 minibatches -> (metrics, trainable weights after it, the
    largest change of a policy weight)."""
    from rlx_cli.config.compose import compose, job_config
    from rlx_cli.engine.sharding import full_tensors
    from rlx_cli.loops.build import build
    from rlx_cli.loops.checkpoint import TrainState
    from rlx_cli.loops.progress import Progress
    from rlx_cli.loops.update import UpdateBatch, update_step

    cfg = job_config(
        compose(["model=hf", f"model.path={model_dir}", "trainer.threads=1", f"loss_agg.mode={mode}", *overrides])
    )
    parts = build(cfg, Progress(silent=True))
    models, engine = parts.models, parts.engine
    parts.policy_optimizer = sgd(parts.policy_optimizer)
    if parts.critic_optimizer is not None:
        parts.critic_optimizer = sgd(parts.critic_optimizer)
    torch.manual_seed(0)  # the same batch in every process
    prompts = [f"{i % 9 + 1},{i % 7 + 2},{i % 5 + 3}:" for i in range(16)]
    with engine.sampling():
        batch = parts.sampler.generate(models.policy, prompts, temperature=1.0, max_new_tokens=12)
    mask = batch.response_mask
    if "trainer.micro_batch_tokens=48" in overrides:
        assert len(engine.micro_batches(batch)) >= 6, overrides  # the budget does split the batch
    old_logp, ref_logp = engine.logp(batch, 1.0), engine.logp(batch, 1.0, reference=True)
    values = engine.values(batch) if models.critic is not None else None
    noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    advantages = noise * mask * (torch.arange(16) % 4 != 0).unsqueeze(1)  # a quarter of the rows skip the backward
    returns = None if values is None else (values + noise.flip(0)) * mask
    positive = torch.arange(16) % 3 == 0

    def trainable() -> dict[str, torch.Tensor]:  # whole copies (full_tensors may return the weights themselves)
        weights = {n: p for n, p in models.policy.named_parameters() if p.requires_grad}
        return {n: t.clone() for n, t in full_tensors(weights).items()}

    before = trainable()
    torch.manual_seed(2)  # the minibatch permutation: rank 0's draw is one process's draw
    inputs = UpdateBatch(batch, advantages, positive, old_logp, ref_logp, values, returns)
    metrics, _ = update_step(cfg, parts, TrainState(), 1, inputs)
    weights = trainable()
    moved = max((w - before[n]).abs().max().item() for n, w in weights.items())
    assert moved > 1e-3  # the update moved the policy
    if models.critic is not None:
        weights.update({f"critic.{n}": t for n, t in full_tensors(models.critic.state_dict()).items()})
    return metrics, weights, moved


def check_gather_and_agreement() -> None:
    """``gather_samples`` rebuilds the one-process batch; the NaN-guard flag and stop signals are agreed on."""
    from rlx_cli.engine import distributed
    from rlx_cli.engine.base_model import char_tokenizer
    from rlx_cli.engine.batch import Rollout, position_ids

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
    from rlx_cli.engine import distributed

    distributed.start()
    check_gather_and_agreement()
    for name, mode, overrides in CASES:
        for budget in ("whole", "micro"):
            metrics, weights, _ = one_update(model_dir, mode, overrides + (MICRO if budget == "micro" else []))
            save_file(weights, str(out_dir / f"{name}-{budget}-{rank}.safetensors"))
            (out_dir / f"{name}-{budget}-{rank}.json").write_text(json.dumps(metrics))


def compare(name: str, reference: tuple, weights: dict, metrics: dict) -> float:
    """The largest weight difference relative to the largest move; asserts it and the losses within 1e-5."""
    ref_metrics, ref_weights, moved = reference
    assert weights.keys() == ref_weights.keys()
    diff = max((weights[k] - ref_weights[k]).abs().max().item() for k in weights) / moved
    assert diff < 1e-5, (name, diff)
    for key in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm", "train/value_loss"):
        if key in ref_metrics:
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-5, abs=1e-7), (name, key)
    return diff


def test_micro_batches_and_processes_update_like_one_process_on_the_whole_batch(model_dir, tmp_path):
    torch.multiprocessing.spawn(worker, args=(free_port(), model_dir, tmp_path), nprocs=2)
    for name, mode, overrides in CASES:
        plain = [o for o in overrides if not o.startswith("trainer.strategy")]
        reference = one_update(model_dir, mode, plain)
        if name == mode:  # the strategies' cases have their plain twin among the loss_agg cases' settings
            _, weights, _ = one_update(model_dir, mode, plain + MICRO)
            print(f"{name} 1 process, micro-batches: {compare(name, reference, weights, reference[0]):.1e}")
        for budget in ("whole", "micro"):
            for rank in (0, 1):
                theirs = load_file(tmp_path / f"{name}-{budget}-{rank}.safetensors")
                their_metrics = json.loads((tmp_path / f"{name}-{budget}-{rank}.json").read_text())
                diff = compare(f"{name} {budget} rank {rank}", reference, theirs, their_metrics)
                print(f"{name} 2 processes, {budget} batch, rank {rank}: max |Δ weight| / max move {diff:.1e}")


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


STRATEGY_RUN = ["launcher=torchrun", *SHORT, "trainer.steps=6", "algo=vapo", "value_pretrain.steps=1",
                "trainer.ckpt_every=1", "tracking=none", "trainer.micro_batch_tokens=256"]  # fmt: skip


def killed_at_step(workdir, overrides: list[str], step: int) -> None:
    """``rlx train OVERRIDES``, SIGKILLed (torchrun and its processes) once checkpoint ``step`` is complete."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "rlx_cli", "train", *overrides], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    marker = workdir / "killed" / "checkpoints" / f"step-{step:06d}" / "state.json"
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert marker.exists() and not (workdir / "killed" / "final").exists(), "the run ended before it was killed"


@pytest.mark.slow
def test_strategies_train_alike_and_resume_after_sigkill(workdir):
    """ddp, zero1 and fsdp on two processes: the same samples, losses and gradient norms; a run SIGKILLed after its
    second checkpoint and resumed with trainer.resume=true ends where the uninterrupted run ends; ``final/`` is a
    whole model that ``from_pretrained`` loads."""
    from transformers import LlamaForCausalLM

    final = {}
    for strategy in ("ddp", "zero1", "fsdp"):
        out = rlx("train", *STRATEGY_RUN, f"trainer.strategy={strategy}", f"trainer.output_dir={strategy}",
                  cwd=workdir, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        final[strategy] = json.loads((workdir / strategy / "metrics.json").read_text())
    keys = ["train/loss", "train/pg_loss", "train/grad_norm", "train/value_loss", "train/reward", "eval/accuracy"]
    for strategy in ("zero1", "fsdp"):
        for key in keys:
            assert final[strategy][key] == pytest.approx(final["ddp"][key], rel=1e-4, abs=1e-6), (strategy, key)
        run = [*STRATEGY_RUN, f"trainer.strategy={strategy}", "trainer.output_dir=killed"]
        killed_at_step(workdir, run, step=2)
        out = rlx("train", *run, "trainer.resume=true", cwd=workdir, env={"OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        assert "resuming from" in out.stderr
        resumed = json.loads((workdir / "killed" / "metrics.json").read_text())
        for key in keys:
            assert resumed[key] == pytest.approx(final[strategy][key], rel=1e-5, abs=1e-7), (strategy, key)
        model = LlamaForCausalLM.from_pretrained(workdir / "killed" / "final")
        whole = load_file(workdir / "ddp" / "final" / "model.safetensors")
        for name, weight in model.state_dict().items():
            if name in whole:
                assert torch.allclose(weight, whole[name], atol=1e-4), (strategy, name)
        shutil.rmtree(workdir / "killed")


@pytest.mark.slow
def test_fsdp_under_bf16_mixed_trains_a_critic(workdir):
    """FSDP's bf16 mixed-precision policy casts what it shards; the critic's value head stays float32."""
    out = rlx("train", "launcher=torchrun", *SHORT, "trainer.steps=2", "algo=vapo", "value_pretrain.steps=1",
              "trainer.strategy=fsdp", "trainer.precision=bf16-mixed", "tracking=none", "trainer.output_dir=out",
              cwd=workdir, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads((workdir / "out" / "metrics.json").read_text())
    assert all(math.isfinite(metrics[k]) for k in ("train/loss", "train/value_loss", "train/grad_norm"))
