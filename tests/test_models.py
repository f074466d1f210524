"""Policy, reference and critic wiring: LoRA shares one base; each optimizer moves only its own weights."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny_llama
from omegaconf import OmegaConf
from transformers import LlamaForCausalLM

from rlx_cli.config.compose import compose
from rlx_cli.engine.logprobs import response_logp
from rlx_cli.engine.models import SharedCritic, build_models
from rlx_cli.sampling.rollout import HFSampler


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random tiny Llama saved like a user's checkpoint."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"), layers=1, heads=1, head_dim=32, tie=True)


def snapshot(module, marker: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if marker in n}


def changed(before: dict[str, torch.Tensor], module) -> bool:
    now = dict(module.named_parameters())
    return any(not torch.equal(before[n], now[n]) for n in before)


def test_lora_critic_is_a_second_adapter_on_the_shared_base(model_dir):
    cfg = compose(["algo=vapo", "model.finetune=lora"])
    models = build_models(model_dir, cfg.model, needs_critic=True, critic_cfg=cfg.critic)
    assert models.reference is None and isinstance(models.critic, SharedCritic)
    base_weights = [n for n, _ in models.policy.named_parameters() if "lora_" not in n]
    assert not any(p.requires_grad for n, p in models.policy.named_parameters() if n in base_weights)

    batch = HFSampler(models.tokenizer).generate(models.policy, ["1,2:", "3,4,5:"], temperature=1.0, max_new_tokens=6)
    policy_before, critic_before = snapshot(models.policy, ".default."), snapshot(models.policy, ".critic.")
    critic_opt = torch.optim.SGD(models.critic.trainable_parameters(), lr=1.0)
    with torch.no_grad():
        models.critic.head.weight.fill_(1.0)  # zero-initialised: through a zero head the adapter gets no gradient
    models.critic(batch).sum().backward()
    critic_opt.step()
    assert changed(critic_before, models.policy) and not changed(policy_before, models.policy)

    policy_params = [p for n, p in models.policy.named_parameters() if p.requires_grad and ".critic." not in n]
    policy_opt = torch.optim.SGD(policy_params, lr=1.0)
    critic_before = snapshot(models.policy, ".critic.")
    logp, _ = response_logp(models.policy, batch, 1.0)
    (logp * batch.response_mask).sum().backward()
    policy_opt.step()
    assert changed(policy_before, models.policy) and not changed(critic_before, models.policy)


def test_lora_reference_is_the_base_with_adapters_disabled(model_dir):
    cfg = compose(["model.finetune=lora"])
    models = build_models(model_dir, cfg.model, needs_critic=False, critic_cfg=cfg.critic)
    batch = HFSampler(models.tokenizer).generate(models.policy, ["1,2:"], temperature=1.0, max_new_tokens=6)
    with torch.no_grad():
        for p in (p for n, p in models.policy.named_parameters() if "lora_B" in n):
            p.fill_(0.5)  # make the adapter matter
        with models.reference_context():
            ref, _ = response_logp(models.reference_model, batch, 1.0)
        policy, _ = response_logp(models.policy, batch, 1.0)
    plain = LlamaForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        base, _ = response_logp(plain, batch, 1.0)
    assert torch.allclose(ref, base, atol=1e-5) and not torch.allclose(policy, base, atol=1e-3)


def test_full_finetune_gets_a_frozen_reference_copy(model_dir):
    cfg = compose(["algo=ppo"])
    models = build_models(model_dir, cfg.model, needs_critic=True, critic_cfg=cfg.critic)
    assert models.reference is not models.policy and not any(p.requires_grad for p in models.reference.parameters())
    assert models.critic is not None and OmegaConf.select(cfg, "critic.init") == "policy"


def test_device_auto_is_the_cpu_without_cuda_and_cuda_is_refused_in_one_line(monkeypatch):
    from rlx_cli.config.errors import UserError
    from rlx_cli.engine.models import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match=r"trainer.device=cuda: .*valid choices: auto, cpu, cuda"):
        pick_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun: this process's GPU
    assert pick_device("auto") == torch.device("cuda", 1)


def test_models_land_on_the_device_asked_for(model_dir):
    cfg = compose(["algo=vapo", "model.finetune=full"])
    models = build_models(model_dir, cfg.model, needs_critic=True, critic_cfg=cfg.critic, device="meta")
    for module in (models.policy, models.reference, models.critic):
        assert {p.device.type for p in module.parameters()} == {"meta"}
    assert models.device == torch.device("meta")


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_activation_checkpointing_keeps_every_gradient(model_dir, finetune):
    """Policy and critic (a separate model with full fine-tuning, a second adapter with LoRA): the gradients of a
    loss on log-probs, entropy and values are the same with activations recomputed in backward."""
    from rlx_cli.engine.logprobs import causal_lm

    grads = {}
    for checkpointing in (False, True):
        cfg = compose(["algo=vapo", f"model.finetune={finetune}", f"model.activation_checkpointing={checkpointing}"])
        torch.manual_seed(0)
        models = build_models(model_dir, cfg.model, needs_critic=True, critic_cfg=cfg.critic)
        assert causal_lm(models.policy).is_activation_checkpointing is checkpointing
        torch.manual_seed(1)
        batch = HFSampler(models.tokenizer).generate(models.policy, ["1,2:", "3,4,5:"], temperature=1.0,
                                                     max_new_tokens=6)  # fmt: skip
        with torch.no_grad():
            models.critic.head.weight.fill_(0.5)  # a zero head passes no gradient to the critic's body
        params = {n: p for n, p in models.policy.named_parameters() if p.requires_grad}
        params.update({f"critic.{n}": p for n, p in models.critic.named_parameters() if p.requires_grad})
        logp, entropy = models.scorer(batch, 0.8, with_entropy=True)
        policy_loss = (logp.sum() + entropy.sum()) / batch.response_mask.sum()
        grads[checkpointing] = dict(zip(params, torch.autograd.grad(policy_loss, list(params.values()),
                                                                    allow_unused=True)))  # fmt: skip
        with models.critic.active():  # as the value update backpropagates
            value_loss = models.critic(batch).square().sum() / batch.response_mask.sum()
            for name, grad in zip(params, torch.autograd.grad(value_loss, list(params.values()), allow_unused=True)):
                grads[checkpointing][f"value {name}"] = grad
    assert grads[True].keys() == grads[False].keys()
    for name, grad in grads[False].items():
        if grad is None:
            assert grads[True][name] is None, name
        else:
            assert torch.allclose(grads[True][name], grad, rtol=1e-5, atol=1e-7), name
