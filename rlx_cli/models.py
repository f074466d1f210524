"""Step 3 of a run: the policy (LoRA or full), its reference and, when the advantage needs values, a critic."""

from __future__ import annotations

import copy
import json
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from rlx_cli.errors import UserError
from rlx_cli.rollout import Rollout


@dataclass
class Models:
    policy: nn.Module
    tokenizer: object
    reference: nn.Module | None  # None with LoRA: the policy with its adapters disabled
    critic: Critic | SharedCritic | None

    def reference_context(self):
        """Inside it, ``self.reference_model`` computes reference log-probs."""
        return self.policy.disable_adapter() if self.reference is None else nullcontext()

    @property
    def reference_model(self) -> nn.Module:
        return self.policy if self.reference is None else self.reference

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device


def load_pretrained(path: Path, model_cfg: DictConfig):
    """(causal LM, tokenizer) from a local ``save_pretrained`` directory; one clear line if it is not one."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype(model_cfg.dtype), trust_remote_code=model_cfg.trust_remote_code
        )
    except (OSError, ValueError, json.JSONDecodeError, SafetensorError) as error:  # a truncated or corrupt file
        raise UserError(f"model.path={path} cannot be loaded: {str(error).splitlines()[0]}") from error
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def torch_dtype(name: str) -> torch.dtype:
    """``auto`` is bfloat16 on a GPU and float32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, name)


def pick_device(name: str) -> torch.device:
    """``trainer.device``: ``auto`` is this process's GPU (``LOCAL_RANK`` under torchrun) when CUDA is
    available, else the CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"trainer.device={name}: torch sees no CUDA device here; valid choices: auto, cpu, cuda")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def build_models(
    path: Path, model_cfg: DictConfig, *, needs_critic: bool, critic_cfg: DictConfig, device: str = "cpu"
) -> Models:
    """Policy, reference and critic on ``device``."""
    model, tokenizer = load_pretrained(path, model_cfg)
    if model_cfg.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        lora = OmegaConf.to_container(model_cfg.lora)
        config = LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=lora["target_modules"],
            task_type="CAUSAL_LM",
        )
        policy, reference = get_peft_model(model, config), None
        critic = SharedCritic(policy, config) if needs_critic and critic_cfg.init == "policy" else None
    else:
        policy, critic = model, None
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    if needs_critic and critic is None:
        critic = Critic.from_weights(path, model_cfg, critic_cfg)
    for module in (policy, reference, critic):  # the LoRA critic moves its head; its adapter moves with the policy
        if module is not None:
            module.to(device)
    return Models(policy, tokenizer, reference, critic)


def value_head(hidden_size: int) -> nn.Linear:
    head = nn.Linear(hidden_size, 1)
    nn.init.zeros_(head.weight)  # V = 0 everywhere at the start: no made-up values
    nn.init.zeros_(head.bias)
    return head


def values_at_responses(hidden: torch.Tensor, head: nn.Linear, batch: Rollout) -> torch.Tensor:
    """The value of response token t from the hidden state of the position before it -> [B, T]."""
    start = batch.prompt_len - 1
    return head(hidden[:, start : start + batch.responses.shape[1]].float()).squeeze(-1)  # an fp32 head


class Critic(nn.Module):
    """V(s_t) for every response token: a causal-LM body plus a zero-initialised ``Linear(hidden, 1)``.

    The value of response token t is read from the hidden state of the position before it, the state in
    which the policy chose that token.
    """

    def __init__(self, body: nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.head = value_head(hidden_size)

    @classmethod
    def from_weights(cls, path: Path, model_cfg: DictConfig, critic_cfg: DictConfig) -> Critic:
        from transformers import AutoModel

        source = Path(path) if critic_cfg.init == "policy" else Path(critic_cfg.init)
        body = AutoModel.from_pretrained(
            source, dtype=torch_dtype(model_cfg.dtype), trust_remote_code=model_cfg.trust_remote_code
        )
        return cls(body, body.config.hidden_size)

    def forward(self, batch: Rollout) -> torch.Tensor:
        """-> values [B, T]"""
        hidden = self.body(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).last_hidden_state
        return values_at_responses(hidden, self.head, batch)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())

    def state_to_save(self) -> dict[str, torch.Tensor]:
        return self.state_dict()


class SharedCritic(nn.Module):
    """The LoRA critic: a second adapter (``critic``) plus a value head on the policy's frozen base.

    Actor, critic and reference share one copy of the base weights; ``forward`` switches the active
    adapter to ``critic`` and back to the policy's ``default``.
    """

    def __init__(self, policy: nn.Module, lora_config):
        super().__init__()
        policy.add_adapter("critic", lora_config)
        self.policy = [policy]  # a list, so the policy's parameters are not registered twice
        self.adapters = [p for n, p in policy.named_parameters() if "lora_" in n]
        self.head = value_head(policy.get_base_model().config.hidden_size)
        self.use("default")

    def use(self, adapter: str) -> None:
        """Activate one adapter; both stay trainable (peft's set_adapter freezes the inactive one, and a
        tensor frozen between forward and backward gets no gradient)."""
        self.policy[0].set_adapter(adapter)
        for p in self.adapters:
            p.requires_grad_(True)

    def forward(self, batch: Rollout) -> torch.Tensor:
        """-> values [B, T]"""
        self.use("critic")
        try:
            hidden = (
                self.policy[0]
                .get_base_model()
                .base_model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
                )
                .last_hidden_state
            )
        finally:
            self.use("default")
        return values_at_responses(hidden, self.head, batch)

    def trainable_parameters(self) -> list[nn.Parameter]:
        adapter = [p for n, p in self.policy[0].named_parameters() if ".critic." in n]
        return adapter + list(self.head.parameters())

    def state_to_save(self) -> dict[str, torch.Tensor]:
        return self.head.state_dict()  # the adapter is saved with the policy, under critic/


def response_logp(model: nn.Module, batch: Rollout, temperature: float, *, with_entropy: bool = False):
    """Log-probs of the sampled response tokens under ``model`` -> (logp [B, T], entropy [B, T] or None)."""
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    start = batch.prompt_len - 1
    logits = logits[:, start : start + batch.responses.shape[1]].float() / max(temperature, 1e-6)
    logprobs = logits.log_softmax(-1)
    logp = logprobs.gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1) if with_entropy else None
    return logp, entropy


@contextmanager
def evaluating(*modules: nn.Module):
    """Eval mode (no dropout) inside, the previous modes restored after."""
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)
