"""Rollouts with a vLLM engine in the training process (colocated), kept in step with the policy.

After every update ``sync`` copies the policy into the engine without a restart: full fine-tuning reloads the
weights in place (the worker's ``reload_weights``); LoRA either sends the merged weights the same way
(``rollout.lora_sync=merged``) or saves the adapter for a new ``LoRARequest`` (``adapter``). On a GPU the engine
can sleep (weights to CPU, KV cache freed) while the trainer holds the memory (``rollout.sleep``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import DictConfig

from rlx_cli.engine.batch import Rollout
from rlx_cli.sampling.rollout import HFSampler, assemble


class VLLMSampler(HFSampler):
    """``generate`` like ``HFSampler`` (same prompts, same Rollout) from a ``vllm.LLM`` on the policy's weights."""

    def __init__(
        self,
        path: Path,
        tokenizer,
        rollout: DictConfig,
        model: DictConfig,
        *,
        chat_template: bool,
        seed: int,
        dtype: torch.dtype,
    ):
        super().__init__(tokenizer, top_p=rollout.top_p, chat_template=chat_template)
        self.dtype = dtype  # the engine's weights: bfloat16 under a bf16 precision (model.dtype=auto)
        # in-process engine: weights are handed over as tensors, not pickled to a worker process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM's own lines drown rlx's; its warnings on each reload (rotary cache, tied head) are expected
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        if not torch.cuda.is_available():
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(rollout.kv_cache_gib)
        from vllm import LLM

        self.lora = model.finetune == "lora"
        self.by_adapter = self.lora and rollout.lora_sync == "adapter"
        self.sleeps = rollout.sleep and torch.cuda.is_available()  # vLLM's CPU backend has no sleep mode
        self.asleep = False
        self.adapter_dir = tempfile.TemporaryDirectory(prefix="rlx-lora-") if self.by_adapter else None
        self.adapter = None  # the LoRARequest of the policy's current adapter
        lora_engine = {"enable_lora": True, "max_lora_rank": model.lora.r, "max_loras": 1} if self.by_adapter else {}
        self.llm = LLM(
            model=str(path),
            dtype=dtype,
            seed=seed,
            enforce_eager=rollout.enforce_eager,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            enable_sleep_mode=self.sleeps,
            logprobs_mode="processed_logprobs",  # after temperature and top-p: what the trainer's old_logp measures
            trust_remote_code=model.trust_remote_code,
            **lora_engine,
        )

    @torch.no_grad()
    def generate(self, model, prompts: list[str], *, temperature: float, max_new_tokens: int, prefixes=None) -> Rollout:
        """``model`` is unused: the engine holds the policy's weights as of the last ``sync``. ``prefixes``: as
        ``HFSampler.generate`` (each request's prompt tokens end with its prefix)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake()
        enc = self.encode(prompts, prefixes)
        token_ids = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        # one seed per request, drawn from torch's generator: runs repeat, and equal prompts still differ
        first = int(torch.randint(2**31 - len(prompts), ()))
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=self.top_p if temperature > 0 else 1.0,
                max_tokens=max_new_tokens,
                logprobs=0 if temperature > 0 else None,
                seed=first + i if temperature > 0 else None,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in token_ids], params, use_tqdm=False, lora_request=self.adapter
        )
        self.rest()
        completions = [o.outputs[0] for o in outs]
        width = max(len(c.token_ids) for c in completions)
        responses = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        logp = torch.zeros(len(prompts), width) if temperature > 0 else None
        for row, c in enumerate(completions):
            responses[row, : len(c.token_ids)] = torch.tensor(c.token_ids)
            if logp is not None:
                logp[row, : len(c.token_ids)] = torch.tensor([d[t].logprob for t, d in zip(c.token_ids, c.logprobs)])
        return assemble(self.tokenizer, enc, responses, logp)

    @torch.no_grad()
    def sync(self, model) -> None:
        """Give the engine the policy's current weights, then drop KV blocks cached under the old ones."""
        self.wake()
        if self.by_adapter:
            self.load_adapter(model)
        else:
            weights = merged_lora_weights(model) if self.lora else model.named_parameters()
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": detached(weights, self.dtype)})
            self.llm.apply_model(repack_tied_head)
        self.llm.reset_prefix_cache()
        self.rest()

    def load_adapter(self, model) -> None:
        """Save the policy's adapter (safetensors) and swap it in under a new LoRA id; the old one is dropped."""
        from vllm.lora.request import LoRARequest

        previous = self.adapter
        number = previous.lora_int_id + 1 if previous else 1
        path = Path(self.adapter_dir.name) / f"v{number}"
        model.save_pretrained(path, selected_adapters=["default"], safe_serialization=True)
        self.adapter = LoRARequest(f"policy-v{number}", number, str(path))
        if previous:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path)

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def rest(self) -> None:
        """With ``rollout.sleep`` on a GPU: weights to CPU and KV cache freed until the next generate or sync."""
        if self.sleeps:
            self.llm.sleep(level=1)
            self.asleep = True


def repack_tied_head(model) -> None:
    """vLLM's CPU backend packs ``lm_head``'s weight for its GEMM at load time; tied to the embeddings, the head
    gets no weights of its own in a reload and keeps the old pack. Pack it again from the reloaded embeddings."""
    head = getattr(model, "lm_head", None)
    if hasattr(head, "cpu_linear") and model.config.tie_word_embeddings:
        head.quant_method.process_weights_after_loading(head)


def detached(weights, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Each weight detached and cast to the engine's dtype one at a time (float32 masters are never copied whole)."""
    return ((name, w.detach().to(dtype)) for name, w in weights)


def merged_lora_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights with the ``default`` adapter added (W + scale·B·A), under the base model's names.

    The LoRA model itself is left as it is (no in-place merge and unmerge, which would drift in float).
    """
    base = model.get_base_model()
    for name, param in base.named_parameters():
        if "lora_" in name:
            continue
        if name.endswith(".base_layer.weight"):
            layer = base.get_submodule(name.removesuffix(".base_layer.weight"))
            yield name.replace(".base_layer.", "."), param + layer.get_delta_weight("default")
        else:
            yield name, param
