"""A Llama- or Qwen2-style decoder's forward as plain functions over the model's own modules: the training forward
of the models it fits (``engine/logprobs.py``) and ``rollout=fast``'s prefill and decode step.

Each piece computes what transformers' layer computes, op for op (the same projections, LoRA's wrappers included,
RMSNorm in float32 with the weight applied after casting back, the rotary angles of each position, one
``scaled_dot_product_attention`` per layer), so a prefill's values are transformers' bit for bit on the CPU here
(tests/test_fast_sampler.py). What the training forward leaves out is work whose result nobody reads: its last
layer runs the query side (query projection, attention, output projection, MLP) only for the positions that predict
response tokens, keys and values still from every position. Fewer rows through a matmul may round differently, so
log-probs and gradients equal transformers' to float32 rounding (tests/test_logprobs.py). In the tiny default's
update (two layers, a third of the positions prompt) this took 9% off the forward and backward of a step's batch.

Under activation checkpointing (``model.activation_checkpointing``) the training forward recomputes its own layer
function (``torch.utils.checkpoint``, non-reentrant) for the layers transformers marked, and ``trainer.compile`` runs
that function through ``torch.compile``: the same values and gradients (tests/test_compiled_update.py), with the
elementwise chains around the matmuls (RMSNorm's casts, rotary, SwiGLU) fused.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor, nn
from torch.nn.functional import rms_norm, scaled_dot_product_attention
from torch.utils.checkpoint import checkpoint

ARCHITECTURES = ("llama", "qwen2")  # decoder layers these functions compute as transformers does
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")  # angles that change with the sequence's length: no fixed table


# where the forward hooks that leave a module's numbers alone come from: FSDP2's gathering of a unit's parameters,
# and transformers' make_inputs_require_grads on the embeddings under activation checkpointing
VALUE_PRESERVING_HOOKS = ("torch.distributed.", "transformers.modeling_utils")


def unsupported(lm: nn.Module) -> str | None:
    """What in causal LM ``lm`` these functions do not compute (None: nothing): an architecture other than Llama
    or Qwen2, sliding-window attention, rotary angles that depend on the sequence's length, or a forward hook (these
    functions call few of the model's modules, so a hook on any other would not run)."""
    what = lm.config.model_type
    if what not in ARCHITECTURES:
        return what
    rope_type = lm.model.rotary_emb.rope_type
    if any(getattr(layer.self_attn, "sliding_window", None) for layer in lm.model.layers):
        return f"{what} with sliding-window attention"
    if any(kind in rope_type for kind in LENGTH_DEPENDENT_ROPE):
        return f"{what} with {rope_type} rotary scaling"
    hooked = hooked_module(lm)
    if hooked is not None:
        return f"{what} with a forward hook on {hooked}"
    return None


def hooked_module(lm: nn.Module) -> str | None:
    """The name of the first module of ``lm`` with a forward hook or pre-hook that may change what it computes (one
    not from ``VALUE_PRESERVING_HOOKS``); None if there is none."""
    for name, module in lm.named_modules():
        hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]
        if any(not getattr(hook, "__module__", "").startswith(VALUE_PRESERVING_HOOKS) for hook in hooks):
            return name or "the model itself"
    return None


def trains(lm: nn.Module) -> bool:
    """Whether ``forward`` can be ``lm``'s training forward: a computed architecture (``unsupported``), none of whose
    modules is an FSDP unit (FSDP2 gathers a unit's parameters in hooks on the unit's own forward, which ``forward``
    does not call), and no attention dropout. Layers that transformers would checkpoint ``forward`` recomputes itself
    (``recomputes``)."""
    from torch.distributed.fsdp import FSDPModule

    if unsupported(lm) is not None:
        return False
    sharded = any(isinstance(m, FSDPModule) for m in lm.model.modules())
    dropping = (layer.self_attn.training and layer.self_attn.attention_dropout for layer in lm.model.layers)
    return not sharded and not any(dropping)


def recomputes(layer: nn.Module) -> bool:
    """Whether decoder ``layer``'s activations are recomputed in backward, as transformers decides it: its flag set
    (``activation_checkpointing_enable``), train mode, gradients on."""
    return bool(getattr(layer, "gradient_checkpointing", False)) and layer.training and torch.is_grad_enabled()


def forward(
    lm: nn.Module,
    ids: Tensor,
    mask: Tensor,
    positions: Tensor,
    from_: int,
    *,
    width: int = 0,
    kv: list | None = None,
    compiled: bool = False,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Left-padded ``ids``, ``mask``, ``positions`` [B, L] through the decoder -> (the final norm's hidden states of
    positions ``from_`` on [B, L - from_, H], the rotary table (cos, signed sin) [max(L, width), D]).

    ``kv``: a list that receives each layer's (key, value) [B, kv_heads, L, D]. ``compiled``: each layer through
    ``compiled_layer`` (``trainer.compile``). A layer that ``recomputes`` runs under ``torch.utils.checkpoint``
    (non-reentrant): its activations are dropped after the forward and ``layer`` runs again in backward."""
    x = lm.model.embed_tokens(ids)
    cos, sin = rotary_table(lm, x, max(ids.shape[1], width))
    angles = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # [B, 1, L, D]
    visible = visible_keys(mask)
    last = len(lm.model.layers) - 1
    run = compiled_layer() if compiled else layer
    for i, module in enumerate(lm.model.layers):
        start = from_ if i == last else 0
        if kv is None and recomputes(module):
            x = checkpoint(run, module, x, angles, visible, start, use_reentrant=False)
        else:
            x = run(module, x, angles, visible, start, kv)
    return norm(lm.model.norm, x), (cos, sin)


def layer(
    module: nn.Module, x: Tensor, angles: tuple[Tensor, Tensor], visible: Tensor, start: int, kv: list | None = None
) -> Tensor:
    """Decoder layer ``module`` on hidden states ``x`` [B, L, H] -> [B, L - start, H]: the query side (query
    projection, attention, output projection, MLP) of positions ``start`` on, keys and values of every position.
    ``angles``: (cos, signed sin) [B, 1, L, D]; ``visible``: [B, 1, L, L] (``visible_keys``); ``kv`` receives
    (key, value) [B, kv_heads, L, D]."""
    attention = module.self_attn
    query, key, value = project(attention, norm(module.input_layernorm, x), angles, start)
    if kv is not None:
        kv.append((key, value))
    attended = attend(query, key, value, visible[:, :, start:], attention.scaling, attention.num_key_value_groups)
    return finish(module, x[:, start:], attended)


# the compiled layer's variants: gradients on or off, LoRA's adapters on or off (peft freezes them while off), an input
# that needs a gradient or not (LoRA's first layer), every position's query or the last layer's, two weight dtypes
RECOMPILES = 64


@cache
def compiled_layer():
    """``layer`` through ``torch.compile``, made once per process so that its graphs are kept (every layer of one
    shape reuses them), up to ``RECOMPILES`` of them: torch's default, 8, would run later variants eager."""
    return torch._dynamo.config.patch(cache_size_limit=RECOMPILES)(torch.compile(layer, dynamic=True))


def visible_keys(mask: Tensor) -> Tensor:
    """``mask`` [B, L] (1 on real tokens) -> [B, 1, L, L] bool: each position sees the real positions up to it; a
    padding position sees itself, so that no softmax row is empty (and no NaN reaches a real row)."""
    length, device = mask.shape[1], mask.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return (causal & mask.bool()[:, None, None, :]) | torch.eye(length, dtype=torch.bool, device=device)


def rotary_table(lm: nn.Module, x: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """The model's rotary (cos, sin) for positions 0 .. ``width`` - 1, [width, D] each, in ``x``'s dtype, sin with
    its first half negated: ``rope`` then needs no ``rotate_half``."""
    cos, sin = lm.model.rotary_emb(x, torch.arange(width, device=x.device)[None])
    half = sin.shape[-1] // 2
    return cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)


def norm(module: nn.Module, x: Tensor) -> Tensor:
    """Llama's and Qwen2's RMSNorm by torch's ``rms_norm``: float32 inside, the weight applied after casting back,
    as theirs does, with less Python per call."""
    return weighted_norm(x, module.weight, module.variance_epsilon)


def weighted_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``norm`` of ``x`` [..., H] with the RMSNorm's ``weight`` [H] and ``eps``."""
    return weight * rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


def project(
    attention: nn.Module, x: Tensor, angles: tuple[Tensor, Tensor], start: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """Normed hidden states ``x`` [b, q, H] -> query [b, heads, q - start, D] of positions ``start`` on, key and
    value [b, kv_heads, q, D], query and key rotated by ``angles`` (cos, signed sin [b, 1, q, D])."""
    shape = (*x.shape[:-1], -1, attention.head_dim)
    key, value = (p(x).view(shape).transpose(1, 2) for p in (attention.k_proj, attention.v_proj))
    wanted = x[:, start:].contiguous()  # in bf16 a biased projection of the strided slice rounds otherwise
    query = attention.q_proj(wanted).view(*wanted.shape[:-1], -1, attention.head_dim).transpose(1, 2)
    cos, sin = angles
    return rope(query, cos[:, :, start:], sin[:, :, start:]), rope(key, cos, sin), value


def rope(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor | None = None) -> Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` with the sign moved into ``sin`` (bit for bit the same),
    into ``out`` if given (``x`` itself may be it)."""
    return torch.add(x * cos, x.roll(x.shape[-1] // 2, -1) * sin, out=out)


def attend(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float, groups: int) -> Tensor:
    """Attention of ``query`` [b, heads, q, D] over ``key``, ``value`` [b, kv_heads, n, D] (``groups`` = heads /
    kv_heads), ``mask`` [b, 1, q, n] (bool: visible, or additive) -> the output projection's input [b, q, heads * D].

    Grouped-query attention as transformers computes it under a mask (SDPA's own ``enable_gqa`` with a mask falls
    back to its math kernel on CUDA): one query a row, each key-value head's query heads become its queries
    (``pack_gqa``); else its keys and values are repeated for each of its query heads (``repeat_kv``)."""
    b, heads, q, dim = query.shape
    if groups > 1 and q == 1:
        packed = query.reshape(b, heads // groups, groups, dim)
        return scaled_dot_product_attention(packed, key, value, mask, scale=scale).reshape(b, 1, heads * dim)
    if groups > 1:
        key, value = (x[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2) for x in (key, value))
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(b, q, heads * dim)


def finish(layer: nn.Module, x: Tensor, attended: Tensor) -> Tensor:
    """The rest of a decoder layer after attention: output projection, residual, MLP, residual -> [b, q, H]."""
    x = x + layer.self_attn.o_proj(attended)
    return x + layer.mlp(norm(layer.post_attention_layernorm, x))
