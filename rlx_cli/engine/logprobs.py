"""Log-probs and entropy of the response tokens, from the last hidden states, without the ``[B, L, V]`` logits.

A causal LM's own forward returns logits for every position and the whole vocabulary, ``[B, L, V]``; at V = 32k
and 4k response tokens one float32 copy is 0.5 GiB, and log-softmax and entropy make several. Here the decoder body
runs once, only the real response positions' hidden states ``[N, H]`` go through the output head, in chunks of
``LOGITS_PER_CHUNK`` logits (on a GPU never fewer than ``MIN_CHUNK_ROWS`` tokens), and under autograd each chunk is
recomputed in backward (``torch.utils.checkpoint``), so memory grows with N·H, not N·V. Values and gradients are
the plain path's (log-softmax and entropy in float32); the head is the model's own ``get_output_embeddings()``, so a
head tied to the input embedding or wrapped by LoRA gets its gradient as usual (verl's fused PPO head works the
same way).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rlx_cli.engine import decoder
from rlx_cli.engine.batch import Rollout
from rlx_cli.engine.precision import autocast

LOGITS_PER_CHUNK = 2**22  # 16 MiB of float32 logits at a time (a chunk's backward holds a few such tensors)
# ... but on a GPU at least this many tokens. Each chunk reads the whole head, and under autograd adds into its whole
# gradient, whatever its size: at Qwen2.5's 151,936-token vocabulary 2**22 logits were chunks of 27 tokens, about
# 9,700 of them for 256 answers of 1,024 tokens. With 1,024-token chunks (0.6 GB of float32 logits) a 1.5B step's
# log-probs took 2.9 s instead of 9.5 and its update 12.8 s instead of 37.3 (an H200 against an H100;
# docs/benchmarks.md). On the CPU the head's arithmetic dominates: 1,024-token chunks were no faster (at hidden 896 and
# a 152k vocabulary the same time, at hidden 256 and 32k slower than 131-token ones) and added ~320 MiB to the peak
# at a 32k vocabulary, so the CPU chunks by bytes.
MIN_CHUNK_ROWS = 1024
# config attributes of models whose CausalLM forward changes the logits after the head (Gemma 2/3, Cohere, Granite)
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def causal_lm(model: nn.Module) -> nn.Module:
    """The Hugging Face causal LM inside ``model`` (a peft model's base model with its adapters in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def postprocessed_logits(config) -> str | None:
    """The config attribute by which a model alters its logits after the head, if any (rlx does not apply it)."""
    for name in LOGIT_POSTPROCESSING:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return name
    return None


class Scorer(nn.Module):
    """Every training forward of a causal LM: response log-probs (and entropy), or the body's hidden states.

    It holds the model (``self.lm``), so that under ``trainer.strategy=fsdp`` it is the sharded root whose forward
    gathers the body, the final norm and the head together. ``compute_dtype``: bfloat16 autocast under
    ``trainer.precision=bf16-mixed``, else None. ``compiled``: rlx's own forward runs its layers compiled
    (``trainer.compile``; a model it does not train through runs its own forward, uncompiled).
    """

    def __init__(self, lm: nn.Module, compute_dtype: torch.dtype | None = None, *, compiled: bool = False):
        super().__init__()
        self.lm = lm
        self.compute_dtype = compute_dtype
        self.compiled = compiled

    def forward(self, batch: Rollout, temperature: float = 1.0, *, with_entropy: bool = False, hidden: bool = False):
        """-> (logp [B, T], entropy [B, T] or None) of ``batch``'s responses; ``hidden=True``: the body's last
        hidden states [B, L, H] instead."""
        lm = causal_lm(self.lm)
        device = batch.input_ids.device
        with autocast(self.compute_dtype, device):
            if hidden:
                return lm.base_model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
                ).last_hidden_state
            real = batch.response_mask.bool()
            picked = predicting_states(lm, batch, compiled=self.compiled)[real]  # [N, H]
            logp, entropy = head_logp(
                picked, lm.get_output_embeddings(), batch.responses[real], temperature, with_entropy=with_entropy
            )
        rows, cols = real.nonzero(as_tuple=True)
        place = lambda x: torch.zeros(real.shape, dtype=x.dtype, device=device).index_put((rows, cols), x)  # noqa: E731
        return place(logp), (place(entropy) if with_entropy else None)


def predicting_states(lm: nn.Module, batch: Rollout, *, compiled: bool = False) -> Tensor:
    """Causal LM ``lm``'s last hidden state before each response token, the one that predicts it -> [B, T, H].
    The last response token predicts nothing, so it is not run; nor is a key-value cache kept. A model that
    ``decoder.forward`` computes runs through it (whose last layer skips the prompt's positions; ``compiled``: its
    layers compiled), any other through its own forward."""
    width = batch.prompt_len + batch.responses.shape[1] - 1
    ids, mask, positions = (x[:, :width] for x in (batch.input_ids, batch.attention_mask, batch.position_ids))
    if decoder.trains(lm):
        return decoder.forward(lm, ids, mask, positions, batch.prompt_len - 1, compiled=compiled)[0]
    states = lm.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return states.last_hidden_state[:, batch.prompt_len - 1 :]


def head_logp(hidden: Tensor, head: nn.Module, targets: Tensor, temperature: float, *, with_entropy: bool = False):
    """``hidden`` [N, H] through ``head`` -> (log p(targets) [N], entropy [N] or None), float32, in chunks.

    The logits are divided by ``temperature`` (the sampling distribution's). Entropy H = logsumexp(z) − Σ p·z.
    """
    rows = chunk_rows(head.weight.shape[0], hidden.device)
    recompute = torch.is_grad_enabled() and hidden.shape[0] > rows  # one chunk: nothing to save by recomputing
    pieces = []
    for start in range(0, max(hidden.shape[0], 1), rows):  # no token at all: one empty chunk, still on the graph
        args = (hidden[start : start + rows], targets[start : start + rows])
        piece = (
            checkpoint(_chunk, *args, head, temperature, with_entropy, use_reentrant=False)
            if recompute
            else _chunk(*args, head, temperature, with_entropy)
        )
        pieces.append(piece)
    logp = torch.cat([p[0] for p in pieces])
    return logp, (torch.cat([p[1] for p in pieces]) if with_entropy else None)


def chunk_rows(vocab: int, device: torch.device) -> int:
    """Tokens per chunk of the output head: ``LOGITS_PER_CHUNK`` logits, on a GPU at least ``MIN_CHUNK_ROWS``."""
    return max(1 if device.type == "cpu" else MIN_CHUNK_ROWS, LOGITS_PER_CHUNK // vocab)


def _chunk(hidden: Tensor, targets: Tensor, head: nn.Module, temperature: float, with_entropy: bool):
    logits = head(hidden).float() / max(temperature, 1e-6)
    normaliser = logits.logsumexp(-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser
    if not with_entropy:
        return logp, None
    return logp, normaliser - (logits.softmax(-1) * logits).sum(-1)


def response_logp(model: nn.Module, batch: Rollout, temperature: float, *, with_entropy: bool = False):
    """Log-probs of the sampled response tokens under ``model`` -> (logp [B, T], entropy [B, T] or None)."""
    return Scorer(model)(batch, temperature, with_entropy=with_entropy)
