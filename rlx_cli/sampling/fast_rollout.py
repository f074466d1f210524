"""``rollout=fast``: rlx's own decode loop over the policy's Hugging Face modules, in place of ``generate``.

The same prompts give the same Rollout as ``HFSampler`` (whose ``render`` and ``encode`` it inherits), for Llama- and
Qwen2-style causal LMs, LoRA-wrapped or not. What it does that ``generate`` does not:

- a group's prompt runs once: the loop passes each prompt ``group_size`` times in a row, the prefill runs over the
  distinct rows only, and their keys and values are copied to every row of the run;
- keys and values go into a cache allocated once per chunk at its full width (prompt + ``max_new_tokens``) and
  written in place, not concatenated at every token;
- a row that emits EOS leaves the batch: its cache rows are overwritten by live ones, so later tokens cost only
  the live rows;
- a decode step is the least work that gives ``generate``'s numbers: the layers' own projections and MLP (LoRA's
  wrappers included), torch's RMSNorm, rotary angles looked up in a table made once, the padding's additive mask
  kept in the cache, one ``scaled_dot_product_attention`` per layer; the draw is ``multinomial``'s own algorithm for
  one sample without its checks.

Greedy answers are ``generate``'s token for token (tests/test_fast_sampler.py). Sampling draws from the same
distribution (temperature, then top-k, then top-p, as ``generate``'s warpers cut it) with draws of its own. A model
directory's ``generation_config.json`` (repetition penalty, ``min_new_tokens``, ...) is not read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.functional import rms_norm, scaled_dot_product_attention

from rlx_cli.config.errors import UserError
from rlx_cli.engine.batch import position_ids
from rlx_cli.engine.logprobs import causal_lm
from rlx_cli.sampling.rollout import HFSampler, assemble

ARCHITECTURES = ("llama", "qwen2")  # decoder layers this loop computes as transformers does
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")  # angles that change with the sequence's length: no fixed table


class FastSampler(HFSampler):
    """``HFSampler``'s interface (``rows`` at a time, ``temperature=0`` greedy, ``prefixes``) on rlx's own decode
    loop; ``top_k=0`` is no top-k. Sampled (temperature > 0) answers carry each token's log-prob under the
    distribution it was drawn from (``Rollout.sampler_logp``: after temperature, top-k and top-p), greedy ones none."""

    def __init__(self, tokenizer, *, top_p: float = 1.0, top_k: int = 0, chat_template: bool = False, rows: int = 256):
        super().__init__(tokenizer, top_p=top_p, chat_template=chat_template, rows=rows)
        self.top_k = top_k

    @torch.no_grad()
    def generate_chunk(self, model, prompts: list[str], temperature: float, max_new_tokens: int, prefixes=None):
        tok = self.tokenizer
        enc = self.encode(prompts, prefixes).to(model.device)
        sampling = Sampling(temperature, self.top_p, self.top_k)
        lm = causal_lm(model)
        was_training = lm.training
        lm.eval()
        with torch.inference_mode():  # less work per op than no_grad; the results leave it as ordinary tensors
            responses, logp = decode(lm, enc["input_ids"], enc["attention_mask"], sampling, max_new_tokens, tok)
        lm.train(was_training)
        return assemble(tok, enc, responses.clone(), logp.clone() if temperature > 0 else None)


def check_architecture(model: nn.Module) -> None:
    """A UserError unless ``model``'s decoder layers are ones ``decode`` computes: Llama or Qwen2, full attention,
    rotary angles that depend on the position only."""
    lm = causal_lm(model)
    what = lm.config.model_type
    if what in ARCHITECTURES:
        rope = lm.model.rotary_emb.rope_type
        if any(getattr(layer.self_attn, "sliding_window", None) for layer in lm.model.layers):
            what += " with sliding-window attention"
        elif any(kind in rope for kind in LENGTH_DEPENDENT_ROPE):
            what += f" with {rope} rotary scaling"
    if what not in ARCHITECTURES:
        raise UserError(
            f"rollout=fast computes {' and '.join(ARCHITECTURES)} decoder layers (full attention, fixed rotary "
            f"angles), not {what} (valid: rollout=hf for this model)"
        )


@dataclass(frozen=True)
class Sampling:
    temperature: float  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off


@dataclass
class Cache:
    """Every layer's keys and values, ``keys`` and ``values`` [layers, B, kv_heads, width, head_dim], of which the
    first ``rows`` rows are live and the first ``length`` columns filled.

    ``bias`` [B, width]: the additive attention mask, -inf on the prompts' left padding, 0 elsewhere; ``positions``
    [B]: the position of each row's next token; ``cos``, ``sin`` [width, head_dim]: the rotary table by position,
    ``sin`` with its first half negated (``rope``).
    """

    keys: Tensor
    values: Tensor
    bias: Tensor
    positions: Tensor
    cos: Tensor
    sin: Tensor
    rows: int
    length: int

    def keep(self, going: Tensor) -> Tensor:
        """Only the live rows where ``going`` [rows] bool: each finished row among the first ``going.sum()`` takes
        a live one from after them (a copy of as many rows as finished, filled columns only) -> the former index of
        each kept row."""
        kept, n = int(going.sum()), self.length
        order = torch.arange(self.rows, device=going.device)
        holes, movers = (~going[:kept]).nonzero().squeeze(1), going[kept:].nonzero().squeeze(1) + kept
        for x in (self.keys, self.values):
            x[:, holes, :, :n] = x[:, movers, :, :n]
        for x in (self.bias, self.positions, order):
            x[holes] = x[movers]
        self.rows = kept
        return order[:kept]

    def layer(self, i: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """One token's ``key``, ``value`` [rows, kv_heads, 1, head_dim] into column ``length`` of layer ``i`` -> the
        layer's keys and values up to it, [rows, kv_heads, length + 1, head_dim]."""
        n, b = self.length, self.rows
        self.keys[i, :b, :, n : n + 1] = key
        self.values[i, :b, :, n : n + 1] = value
        return self.keys[i, :b, :, : n + 1], self.values[i, :b, :, : n + 1]


def decode(lm: nn.Module, ids: Tensor, mask: Tensor, sampling: Sampling, max_new_tokens: int, tokenizer):
    """Left-padded prompts ``ids``, ``mask`` [B, P] -> (responses [B, T] long, log-probs [B, T] float32), T the
    longest answer (at most ``max_new_tokens``), padding after a row's EOS."""
    first, run = runs(ids, mask)
    logits, cache = prefill(lm, ids[first], mask[first], run, ids.shape[1] + max_new_tokens)
    logits = logits[run]
    eos = tokenizer.eos_token_id
    responses = ids.new_full((ids.shape[0], max_new_tokens), tokenizer.pad_token_id)
    logp = torch.zeros(responses.shape, dtype=torch.float32, device=ids.device)
    live = torch.arange(ids.shape[0], device=ids.device)  # the row of each live cache row
    for t in range(max_new_tokens):
        tokens, token_logp = pick(logits, sampling)
        responses[live, t], logp[live, t] = tokens, token_logp
        going = tokens != eos
        if t == max_new_tokens - 1 or not going.any():
            break
        if not going.all():
            order = cache.keep(going)
            live, tokens = live[order], tokens[order]
        logits = step(lm, tokens, cache)
    return responses[:, : t + 1], logp[:, : t + 1]


def runs(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Runs of identical consecutive rows of ``ids``, ``mask`` [B, P] -> (the first row of each run [G], each row's
    run [B])."""
    same = (ids[1:] == ids[:-1]).all(1) & (mask[1:] == mask[:-1]).all(1)
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero().squeeze(1), starts.cumsum(0) - 1


def prefill(lm: nn.Module, ids: Tensor, mask: Tensor, run: Tensor, width: int) -> tuple[Tensor, Cache]:
    """Distinct prompts ``ids``, ``mask`` [G, P] through the model -> (the last position's logits [G, V] float32,
    the Cache of their ``run`` [B] rows: each row its prompt's keys and values, ``width`` columns in all)."""
    length, real, device = ids.shape[1], mask.bool(), ids.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    # [G, 1, P, P]; a padding position sees itself, so that no softmax row is empty
    visible = (causal & real[:, None, None, :]) | torch.eye(length, dtype=torch.bool, device=device)
    x = lm.model.embed_tokens(ids)
    cos, sin = rotary_table(lm, x, width)
    at = position_ids(mask)
    angles = cos[at].unsqueeze(1), sin[at].unsqueeze(1)  # [G, 1, P, D]
    keys, values = [], []
    for layer in lm.model.layers:
        query, key, value = project(layer.self_attn, norm(layer.input_layernorm, x), angles)
        keys.append(key)
        values.append(value)
        x = finish(layer, x, attend(layer.self_attn, query, key, value, visible))
    bias = torch.zeros(real.shape[0], width, dtype=keys[0].dtype, device=device)
    bias[:, :length].masked_fill_(~real, float("-inf"))
    cached = widened(keys, run, width), widened(values, run, width)
    cache = Cache(*cached, bias[run], mask.sum(1)[run], cos, sin, rows=len(run), length=length)
    return head(lm, x[:, -1]), cache


def step(lm: nn.Module, tokens: Tensor, cache: Cache) -> Tensor:
    """The next token of every live row, ``tokens`` [b], through the model -> logits [b, V] float32; its keys and
    values join ``cache``."""
    b, at = cache.rows, cache.positions[: cache.rows]
    x = lm.model.embed_tokens(tokens[:, None])  # [b, 1, H]
    angles = cache.cos[at][:, None, None], cache.sin[at][:, None, None]  # [b, 1, 1, D]
    bias = cache.bias[:b, None, None, : cache.length + 1]  # [b, 1, 1, n + 1]
    for i, layer in enumerate(lm.model.layers):
        query, key, value = project(layer.self_attn, norm(layer.input_layernorm, x), angles)
        key, value = cache.layer(i, key, value)
        x = finish(layer, x, attend(layer.self_attn, query, key, value, bias))
    cache.length += 1
    cache.positions += 1
    return head(lm, x[:, -1])


def rotary_table(lm: nn.Module, x: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """The model's rotary (cos, sin) for positions 0 .. ``width`` - 1, [width, D] each, in ``x``'s dtype, sin with
    its first half negated: ``rope`` then needs no ``rotate_half``."""
    cos, sin = lm.model.rotary_emb(x, torch.arange(width, device=x.device)[None])
    half = sin.shape[-1] // 2
    return cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)


def norm(module: nn.Module, x: Tensor) -> Tensor:
    """Llama's and Qwen2's RMSNorm by torch's ``rms_norm``: float32 inside, the weight applied after casting back,
    as theirs does, with less Python per call."""
    normed = rms_norm(x.float(), x.shape[-1:], eps=module.variance_epsilon)
    return module.weight * normed.to(x.dtype)


def project(attention: nn.Module, x: Tensor, angles: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Normed hidden states ``x`` [b, q, H] -> query [b, heads, q, D], key and value [b, kv_heads, q, D], query and
    key rotated by ``angles`` (cos, signed sin [b, 1, q, D])."""
    shape = (*x.shape[:-1], -1, attention.head_dim)
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    query, key, value = (p(x).view(shape).transpose(1, 2) for p in projections)
    return rope(query, *angles), rope(key, *angles), value


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` with the sign moved into ``sin`` (bit for bit the same)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def attend(attention: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Tensor) -> Tensor:
    """Attention of ``query`` [b, heads, q, D] over ``key``, ``value`` [b, kv_heads, n, D], ``mask`` [b, 1, q, n]
    (bool: visible, or additive) -> the output projection's input [b, q, heads * D]."""
    out = scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=attention.scaling, enable_gqa=attention.num_key_value_groups > 1
    )
    return out.transpose(1, 2).reshape(*query.shape[:1], query.shape[2], -1)


def finish(layer: nn.Module, x: Tensor, attended: Tensor) -> Tensor:
    """The rest of a decoder layer after attention: output projection, residual, MLP, residual -> [b, q, H]."""
    x = x + layer.self_attn.o_proj(attended)
    return x + layer.mlp(norm(layer.post_attention_layernorm, x))


def head(lm: nn.Module, x: Tensor) -> Tensor:
    """Last hidden states [b, H] -> logits [b, V] float32."""
    return lm.lm_head(norm(lm.model.norm, x)).float()


def widened(layers: list[Tensor], run: Tensor, width: int) -> Tensor:
    """Each layer's [G, kv_heads, P, D] -> [layers, B, kv_heads, width, D]: row i holds run[i]'s, the columns after P
    allocated and left unset."""
    x = torch.stack(layers)
    out = x.new_empty(x.shape[0], len(run), x.shape[2], width, x.shape[4])
    out[:, :, :, : x.shape[3]] = x[:, run]
    return out


def pick(logits: Tensor, sampling: Sampling) -> tuple[Tensor, Tensor]:
    """Next tokens [b] from ``logits`` [b, V] float32 and their log-probs [b] under the distribution drawn from
    (greedy: argmax, log-prob 0). A draw is an exponential race, argmax p / E with E ~ Exp(1), in which token k wins
    with probability p_k: ``torch.multinomial``'s own algorithm for one sample (the same tokens from the same
    generator state), without its checks of the probabilities, which cost more than the draw."""
    if sampling.temperature == 0:
        return logits.argmax(-1), logits.new_zeros(logits.shape[0])
    logp = truncated(logits / sampling.temperature, sampling.top_k, sampling.top_p).log_softmax(-1)
    tokens = (logp.exp() / torch.empty_like(logp).exponential_()).argmax(-1)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def truncated(scores: Tensor, top_k: int, top_p: float) -> Tensor:
    """``scores`` [b, V] with the tokens outside the top ``top_k`` (0: none) and then outside the smallest set of
    probability >= ``top_p`` set to -inf: transformers' ``TopKLogitsWarper`` and ``TopPLogitsWarper``."""
    if top_k:
        kth = scores.topk(min(top_k, scores.shape[-1]))[0][..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = scores.sort()
        cut = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        cut[..., -1] = False  # the most likely token stays
        scores = scores.masked_fill(cut.scatter(1, order, cut), float("-inf"))
    return scores
