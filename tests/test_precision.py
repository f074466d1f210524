"""``trainer.precision``: where each weight lives, what computes in bf16, and what an update at lr 1e-6 moves."""

from __future__ import annotations

import pytest
import torch
from conftest import SHORT, save_tiny_llama
from safetensors.torch import load_file

from rlx_cli.config.compose import compose
from rlx_cli.engine.models import build_models
from rlx_cli.sampling.rollout import HFSampler


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"), layers=1, heads=1, head_dim=32, tie=True)


def dtypes(module, marker: str = "") -> set[torch.dtype]:
    return {p.dtype for n, p in module.named_parameters() if marker in n}


@pytest.mark.parametrize(
    ("precision", "finetune", "trained", "frozen"),
    [
        ("fp32", "full", torch.float32, torch.float32),
        ("bf16-mixed", "full", torch.float32, torch.bfloat16),
        ("bf16-true", "full", torch.bfloat16, torch.bfloat16),
        ("bf16-mixed", "lora", torch.float32, torch.bfloat16),
        ("bf16-true", "lora", torch.float32, torch.bfloat16),  # LoRA adapters stay float32 under every precision
    ],
)
def test_weights_are_kept_in_the_dtype_the_precision_asks_for(model_dir, precision, finetune, trained, frozen):
    cfg = compose(["algo=vapo", f"model.finetune={finetune}", "model.dtype=auto"])
    models = build_models(model_dir, cfg.model, needs_critic=True, critic_cfg=cfg.critic, precision=precision)
    if finetune == "full":
        assert dtypes(models.policy) == {trained} and dtypes(models.reference) == {frozen}
        assert dtypes(models.critic) == {trained}
    else:
        assert dtypes(models.policy, "lora_") == {trained}
        assert {p.dtype for n, p in models.policy.named_parameters() if "lora_" not in n} == {frozen}
        assert dtypes(models.critic.head) == {torch.float32}
    torch.manual_seed(0)
    batch = HFSampler(models.tokenizer).generate(models.policy, ["1,2:"], temperature=1.0, max_new_tokens=4)
    assert models.critic(batch).dtype == torch.float32  # the value head computes in float32
    assert models.compute_dtype == (torch.bfloat16 if precision == "bf16-mixed" else None)


def test_bf16_mixed_computes_in_bf16_from_float32_weights(model_dir):
    cfg = compose(["model.finetune=full"])
    exact = build_models(model_dir, cfg.model, needs_critic=False, critic_cfg=cfg.critic, precision="fp32")
    mixed = build_models(model_dir, cfg.model, needs_critic=False, critic_cfg=cfg.critic, precision="bf16-mixed")
    torch.manual_seed(0)
    batch = HFSampler(exact.tokenizer).generate(exact.policy, ["1,2:", "3,4,5:"], temperature=1.0, max_new_tokens=8)
    with torch.no_grad():
        a, _ = exact.scorer(batch, 1.0)
        b, _ = mixed.scorer(batch, 1.0)
    assert b.dtype == torch.float32  # log-softmax in float32
    difference = (a - b).abs().max().item()
    assert 0 < difference < 0.05  # bf16 matmuls: close, not equal


def changed_share(output_dir) -> float:
    """The share of the policy's weights that differ from the built-in base model's (in the final weights' dtype)."""
    from rlx_cli.engine.base_model import cache_key, rlx_home

    cfg = compose([])
    base = load_file(rlx_home() / "base" / f"tiny-{cache_key(cfg.model, cfg.task)}" / "model.safetensors")
    final = load_file(output_dir / "final" / "model.safetensors")
    changed = sum((final[k] != base[k].to(final[k].dtype)).sum().item() for k in base)
    return changed / sum(v.numel() for v in base.values())


@pytest.mark.slow
def test_bf16_mixed_moves_every_weight_at_lr_1e6_and_bf16_true_does_not(tmp_path, monkeypatch):
    """Full fine-tuning, lr 1e-6, 5 steps: fp32 master weights take each small AdamW update; pure bf16 rounds
    almost all of them away (bf16 keeps 8 significant bits: an update below |w|·2⁻⁹ is lost)."""
    from rlx_cli.loops.run import train_command

    monkeypatch.chdir(tmp_path)
    share = {}
    for precision in ("bf16-mixed", "bf16-true"):
        train_command([*SHORT, "trainer.steps=5", "trainer.lr=1e-6", "tracking=none", f"trainer.precision={precision}",
                       f"trainer.output_dir={precision}"])  # fmt: skip
        share[precision] = changed_share(tmp_path / precision)
    print(f"weights changed after 5 steps at lr 1e-6: {share}")
    assert share["bf16-mixed"] >= 0.99
    assert share["bf16-true"] < 0.05
