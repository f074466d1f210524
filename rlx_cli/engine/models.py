"""Step 3 of a run: the policy (LoRA or full), its reference and, when the advantage needs values, a critic."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from rlx_cli.config.errors import UserError
from rlx_cli.config.wiring import FROM_POLICY
from rlx_cli.engine.batch import Rollout
from rlx_cli.engine.logprobs import Scorer, causal_lm, postprocessed_logits
from rlx_cli.engine.precision import (
    autocast,
    compute_dtype,
    copy_in_dtype,
    frozen_dtype,
    full_precision,
    trained_dtype,
)


@dataclass
class Models:
    policy: nn.Module
    tokenizer: object
    reference: nn.Module | None  # None with LoRA: the policy with its adapters disabled
    critic: Critic | SharedCritic | None
    scorer: Scorer  # the policy's training forwards (log-probs, entropy, hidden states)
    reference_scorer: Scorer  # the reference's; with LoRA the policy's own, inside reference_context()
    compute_dtype: torch.dtype | None = None  # bfloat16 autocast under trainer.precision=bf16-mixed

    def reference_context(self):
        """Inside it, ``self.reference_scorer`` (and ``self.reference_model``) compute reference log-probs."""
        return self.policy.disable_adapter() if self.reference is None else nullcontext()

    @property
    def reference_model(self) -> nn.Module:
        return self.policy if self.reference is None else self.reference

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device


def from_pretrained(path: Path, key: str, dtype: torch.dtype, *, trust_remote_code: bool):
    """(causal LM, tokenizer) from a local ``save_pretrained`` directory; one clear line naming ``key`` if it is not
    one."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, json.JSONDecodeError, SafetensorError) as error:  # a truncated or corrupt file
        raise UserError(f"{key}={path} cannot be loaded: {str(error).splitlines()[0]}") from error
    return model, tokenizer


def load_pretrained(path: Path, model_cfg: DictConfig, dtype: torch.dtype):
    """(causal LM, tokenizer) of the policy from a local ``save_pretrained`` directory; one clear line if it is not
    one, or if its logits are not the head's."""
    model, tokenizer = from_pretrained(path, "model.path", dtype, trust_remote_code=model_cfg.trust_remote_code)
    altered = postprocessed_logits(model.config)
    if altered:
        raise UserError(
            f"model.path={path}: this {model.config.model_type} model changes its logits after the head "
            f"({altered}), which rlx's log-probs do not apply yet (valid: a model without it, e.g. Llama, Qwen2)"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def pick_device(name: str) -> torch.device:
    """``trainer.device``: ``auto`` is this process's GPU (``LOCAL_RANK`` under torchrun) when CUDA is
    available, else the CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"trainer.device={name}: torch sees no CUDA device here; valid choices: auto, cpu, cuda")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def build_models(
    path: Path,
    model_cfg: DictConfig,
    *,
    needs_critic: bool,
    critic_cfg: DictConfig,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    compile: bool = False,
) -> Models:
    """Policy, reference and critic on ``device``, their weights in the dtypes ``precision`` asks for
    (``rlx_cli/engine/precision.py``: trained weights float32 unless ``bf16-true``; frozen ones by ``model.dtype``);
    ``compile``: rlx's training forward runs its decoder layers through ``torch.compile`` (``trainer.compile``)."""
    trained, frozen = trained_dtype(precision), frozen_dtype(precision, model_cfg.dtype)
    compute = compute_dtype(precision)
    if model_cfg.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        model, tokenizer = load_pretrained(path, model_cfg, frozen)  # the base is frozen; adapters stay float32
        lora = OmegaConf.to_container(model_cfg.lora)
        config = LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=lora["target_modules"],
            task_type="CAUSAL_LM",
        )
        policy, reference = get_peft_model(model, config), None
        scorer = Scorer(policy, compute, compiled=compile)
        reference_scorer = scorer
        critic = SharedCritic(scorer, config) if needs_critic and critic_cfg.init in FROM_POLICY else None
    else:
        policy, tokenizer = load_pretrained(path, model_cfg, trained)
        reference = copy_in_dtype(policy, frozen).eval().requires_grad_(False)
        scorer = Scorer(policy, compute, compiled=compile)
        reference_scorer, critic = Scorer(reference, compute, compiled=compile), None
    if needs_critic and critic is None:
        critic = Critic.from_weights(path, model_cfg, critic_cfg, dtype=trained, compute_dtype=compute)
    for body in (causal_lm(policy), critic.body if isinstance(critic, Critic) else None):
        if body is not None:
            training_mode(body, checkpointing=model_cfg.activation_checkpointing)
    for module in (policy, reference, critic):  # the LoRA critic moves its head; its adapter moves with the policy
        if module is not None:
            module.to(device)
    return Models(policy, tokenizer, reference, critic, scorer, reference_scorer, compute)


def training_mode(model: nn.Module, *, checkpointing: bool) -> None:
    """Train mode without dropout (RL updates, like TRL's ``disable_dropout``, compare log-probs of one policy), and
    with ``checkpointing`` each decoder layer's activations recomputed in backward instead of kept (non-reentrant,
    so LoRA's frozen inputs need no gradient; transformers checkpoints only in train mode). transformers marks the
    layers; rlx's own training forward reads the mark and recomputes its own layer function
    (``decoder.recomputes``), the model's own forward transformers' layer. LoRA's own dropout
    (``model.lora.dropout``) is left as configured."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout) and "lora_dropout" not in name:
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    model.train()
    if checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5.23's name
        if enable is not None:
            enable()
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class ValueHead(nn.Linear):
    """``Linear(hidden, 1)``, zero-initialised (V = 0 everywhere at the start: no made-up values), computing in its
    own dtype (float32 unless ``trainer.precision=bf16-true``) whatever the body's, and returning float32."""

    def __init__(self, hidden_size: int, dtype: torch.dtype = torch.float32):
        super().__init__(hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden.to(self.weight.dtype)).float()


def values_at_responses(hidden: torch.Tensor, head: ValueHead, batch: Rollout) -> torch.Tensor:
    """The value of response token t from the hidden state of the position before it -> [B, T] float32."""
    start = batch.prompt_len - 1
    with full_precision(hidden.device):
        return head(hidden[:, start : start + batch.responses.shape[1]]).squeeze(-1)


class Critic(nn.Module):
    """V(s_t) for every response token: a causal-LM body plus a zero-initialised ``Linear(hidden, 1)``.

    The value of response token t is read from the hidden state of the position before it, the state in
    which the policy chose that token. ``compute_dtype``: the body's autocast dtype (None: none).
    """

    def __init__(self, body: nn.Module, hidden_size: int, compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.body = body
        self.head = ValueHead(hidden_size, next(body.parameters()).dtype)  # one dtype to train (ZeRO needs it)
        self.compute_dtype = compute_dtype

    @classmethod
    def from_weights(
        cls, path: Path, model_cfg: DictConfig, critic_cfg: DictConfig, *, dtype: torch.dtype, compute_dtype
    ) -> Critic:
        from transformers import AutoModel

        source = Path(path) if critic_cfg.init in FROM_POLICY else Path(critic_cfg.init)
        body = AutoModel.from_pretrained(source, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)
        return cls(body, body.config.hidden_size, compute_dtype)

    def forward(self, batch: Rollout) -> torch.Tensor:
        """-> values [B, T]"""
        with autocast(self.compute_dtype, batch.input_ids.device):
            hidden = self.body(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
            ).last_hidden_state
        return values_at_responses(hidden, self.head, batch)

    def active(self):
        """Nothing to switch: the critic is a model of its own (``SharedCritic.active`` switches an adapter)."""
        return nullcontext()

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())

    def state_to_save(self) -> dict[str, torch.Tensor]:
        return self.state_dict()


class SharedCritic(nn.Module):
    """The LoRA critic: a second adapter (``critic``) plus a value head on the policy's frozen base.

    Actor, critic and reference share one copy of the base weights; ``forward`` switches the active
    adapter to ``critic`` and back to the policy's ``default``, and runs the body through the policy's
    ``Scorer`` (the sharded root under ``trainer.strategy=fsdp``).
    """

    def __init__(self, scorer: Scorer, lora_config):
        super().__init__()
        policy = scorer.lm
        policy.add_adapter("critic", lora_config)
        self.scorer = [scorer]  # a list, so the policy's parameters are not registered twice
        self.head = ValueHead(policy.get_base_model().config.hidden_size)
        self.use("default")

    def use(self, adapter: str) -> None:
        """Activate one adapter; both stay trainable (peft's set_adapter freezes the inactive one, and a
        tensor frozen between forward and backward gets no gradient). The parameters are looked up each time:
        FSDP replaces them by their shards."""
        policy = self.scorer[0].lm
        policy.set_adapter(adapter)
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.requires_grad_(True)

    @contextmanager
    def active(self):
        """The critic's adapter on inside, the policy's after. A backward through layers that recompute their
        activations (``model.activation_checkpointing``) recomputes with the adapter active then, so it must run
        inside too."""
        outer = self.scorer[0].lm.active_adapter == "critic"
        if not outer:
            self.use("critic")
        try:
            yield
        finally:
            if not outer:
                self.use("default")

    def forward(self, batch: Rollout) -> torch.Tensor:
        """-> values [B, T]"""
        with self.active():
            hidden = self.scorer[0](batch, hidden=True)
        return values_at_responses(hidden, self.head, batch)

    def trainable_parameters(self) -> list[nn.Parameter]:
        adapter = [p for n, p in self.scorer[0].lm.named_parameters() if ".critic." in n]
        return adapter + list(self.head.parameters())

    def state_to_save(self) -> dict[str, torch.Tensor]:
        return self.head.state_dict()  # the adapter is saved with the policy, under critic/


@contextmanager
def evaluating(*modules: nn.Module):
    """Eval mode (no dropout) inside, the previous modes restored after; a module already in eval mode is left
    alone (setting a mode walks every submodule: about 1 ms a call on the tiny default, twice a sampling)."""
    training = [m for m in modules if m.training]
    for m in training:
        m.eval()
    try:
        yield
    finally:
        for m in training:
            m.train()
