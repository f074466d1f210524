"""``rollout=fast``: rlx's own decode loop over the policy's Hugging Face modules, in place of ``generate``.

The same prompts give the same Rollout as ``HFSampler`` (whose ``render`` and ``encode`` it inherits), for Llama- and
Qwen2-style causal LMs, LoRA-wrapped or not; the layer's math is ``engine/decoder.py``'s, which the training forward
shares. What it does that ``generate`` does not:

- a group's prompt runs once: the loop passes each prompt ``group_size`` times in a row, the prefill runs over the
  distinct rows only, and their keys and values are copied to every row of the run;
- keys and values go into one cache allocated once per chunk at its full width (prompt + ``max_new_tokens``) and
  written in place, not concatenated at every token (in a small model a layer's rotated key and value in one copy);
- a row that emits EOS leaves the batch: its cache rows are overwritten by live ones, so later tokens cost only
  the live rows;
- a decode step is the least work that gives ``generate``'s numbers: the layers' own projections and MLP (LoRA's
  wrappers included), torch's RMSNorm, rotary angles looked up in a table made once, the padding's additive mask
  kept in the cache, one ``scaled_dot_product_attention`` per layer; the draw one uniform number a row through the
  cumulative distribution (``pick``);
- in a small model (plain ``nn.Linear`` projections whose copies take at most ``FUSED_BYTES``) each layer's query,
  key and value projections run as one matmul, its MLP's gate and up projections as another, and the query and key
  are rotated together: a decode step of the tiny default is about 95 kernels of a few microseconds each, so fewer,
  larger ones are faster. Each output column is the same dot product, so the numbers do not change;
- on a GPU (``rollout.cuda_graphs``) the decode step is captured in a CUDA graph and replayed, one launch a token
  instead of about 50 a layer: the step in static form, by buckets of rows (``sampling/cuda_graphs.py``).

Greedy answers are ``generate``'s token for token (tests/test_fast_sampler.py). Sampling draws from the same
distribution (temperature, then top-k, then top-p, as ``generate``'s warpers cut it) with draws of its own. A model
directory's ``generation_config.json`` (repetition penalty, ``min_new_tokens``, ...) is not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn
from torch.nn.functional import linear, silu
from transformers.activations import SiLUActivation

from rlx_cli.config.errors import UserError
from rlx_cli.engine import decoder
from rlx_cli.engine.batch import position_ids
from rlx_cli.engine.decoder import attend, finish, norm, project, rope, weighted_norm
from rlx_cli.engine.logprobs import causal_lm
from rlx_cli.engine.models import evaluating
from rlx_cli.sampling.cuda_graphs import GraphedStep, bucket, enabled
from rlx_cli.sampling.rollout import HFSampler, assemble

FUSED_BYTES = 64 * 2**20  # fused copies of the projections up to this size (a 0.5B model's would take ~0.5 GB)


class FastSampler(HFSampler):
    """``HFSampler``'s interface (``rows`` at a time, ``temperature=0`` greedy, ``prefixes``) on rlx's own decode
    loop; ``top_k=0`` is no top-k. Sampled (temperature > 0) answers carry each token's log-prob under the
    distribution it was drawn from (``Rollout.sampler_logp``: after temperature, top-k and top-p), greedy ones none.
    ``cuda_graphs``: ``rollout.cuda_graphs`` (auto: on CUDA only)."""

    def __init__(
        self,
        tokenizer,
        *,
        top_p: float = 1.0,
        top_k: int = 0,
        chat_template: bool = False,
        rows: int = 256,
        cuda_graphs: str | bool = "auto",
    ):
        super().__init__(tokenizer, top_p=top_p, chat_template=chat_template, rows=rows)
        self.top_k = top_k
        self.cuda_graphs = cuda_graphs

    @torch.no_grad()
    def generate_chunk(self, model, prompts: list[str], temperature: float, max_new_tokens: int, prefixes=None):
        tok = self.tokenizer
        enc = self.encode(prompts, prefixes).to(model.device)
        sampling = Sampling(temperature, self.top_p, self.top_k)
        lm, graphs = causal_lm(model), enabled(self.cuda_graphs, enc["input_ids"].device)
        with evaluating(lm), torch.inference_mode():  # inference mode: less work per op than no_grad
            responses, logp = decode(lm, enc["input_ids"], enc["attention_mask"], sampling, max_new_tokens, tok, graphs)
        return assemble(tok, enc, responses.clone(), logp.clone() if temperature > 0 else None)


def decode_path(model: nn.Module) -> str:
    """How ``rollout=fast`` decodes ``model``'s layers, for a run to say once."""
    why = unfused_because(causal_lm(model))
    return "each layer's projections fused" if why is None else f"each layer's own modules: {why}"


def check_architecture(model: nn.Module) -> None:
    """A UserError unless ``model``'s decoder layers are ones ``decode`` computes: Llama or Qwen2, full attention,
    rotary angles that depend on the position only, no forward hooks."""
    what = decoder.unsupported(causal_lm(model))
    if what is not None:
        raise UserError(
            f"rollout=fast computes {' and '.join(decoder.ARCHITECTURES)} decoder layers (full attention, fixed "
            f"rotary angles, no forward hooks), not {what} (valid: rollout=hf for this model)"
        )


@dataclass(frozen=True)
class Sampling:
    temperature: float  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off


@dataclass(frozen=True)
class Fused:
    """One decoder layer's weights as ``fused_layer`` uses them: the query, key and value projections stacked into
    ``qkv`` [(heads + 2 kv_heads) D, H] (and its bias, Qwen2's), the MLP's gate and up into ``gate_up`` [2 I, H];
    the rest the layer's own tensors, read once instead of through its modules at every token."""

    input_norm: Tensor
    qkv: Tensor
    qkv_bias: Tensor | None
    out: Tensor
    out_bias: Tensor | None
    post_norm: Tensor
    gate_up: Tensor
    down: Tensor
    eps: float
    heads: int
    kv_heads: int
    scale: float


def unfused_because(lm: nn.Module) -> str | None:
    """Why ``fused_layers`` keeps the layers' own modules for ``lm`` (None: it fuses them): a projection that is not a
    plain ``nn.Linear`` (a LoRA wrapper), biases that are not Llama's or Qwen2's (all or none of q, k, v; none on the
    MLP), an activation other than SiLU, norms of two epsilons, or stacked copies over ``FUSED_BYTES``."""
    copied = 0
    for layer in lm.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
        linears = (q, k, v, attention.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(p) is not nn.Linear for p in linears):
            return "a projection is not a plain Linear (LoRA's wrapper)"
        if not isinstance(mlp.act_fn, (nn.SiLU, SiLUActivation)):
            return f"the MLP's activation is {type(mlp.act_fn).__name__}, not SiLU"
        if len({p.bias is None for p in (q, k, v)}) > 1 or any(p.bias is not None for p in linears[4:]):
            return "its biases are neither Llama's nor Qwen2's"
        if layer.post_attention_layernorm.variance_epsilon != layer.input_layernorm.variance_epsilon:
            return "its two norms' epsilons differ"
        copied += sum(p.weight.numel() * p.weight.element_size() for p in (q, k, v, mlp.gate_proj, mlp.up_proj))
        if copied > FUSED_BYTES:
            return f"the stacked copies would take over {FUSED_BYTES // 2**20} MiB"
    return None


def fused_layers(lm: nn.Module) -> list[Fused] | None:
    """Each layer's ``Fused`` weights, or None where ``unfused_because`` says why not."""
    if unfused_because(lm) is not None:
        return None
    fused = []
    for layer in lm.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        q, k, v, o = attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj
        biases = [p.bias for p in (q, k, v)]
        eps = layer.input_layernorm.variance_epsilon
        fused.append(
            Fused(
                input_norm=layer.input_layernorm.weight,
                qkv=torch.cat([q.weight, k.weight, v.weight]),
                qkv_bias=None if biases[0] is None else torch.cat(biases),
                out=o.weight,
                out_bias=o.bias,
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                down=mlp.down_proj.weight,
                eps=eps,
                heads=q.out_features // attention.head_dim,
                kv_heads=k.out_features // attention.head_dim,
                scale=attention.scaling,
            )
        )
    return fused


@dataclass
class Cache:
    """Every layer's keys and values, ``kv`` [layers, B, 2 kv_heads, width, head_dim] (a row's keys, then its
    values), of which the first ``rows`` rows are stepped and the first ``length`` columns filled.

    ``bias`` [B, width]: the additive attention mask, -inf on the prompts' left padding, 0 elsewhere; ``positions``
    [B]: the position of each row's next token; ``cos``, ``sin`` [width, head_dim]: the rotary table by position,
    ``sin`` with its first half negated (``rope``). ``column`` (static form, ``make_static``): ``length`` as a
    device tensor [1], so that a step reads no Python state and its shapes do not grow.
    """

    kv: Tensor
    bias: Tensor
    positions: Tensor
    cos: Tensor
    sin: Tensor
    rows: int
    length: int
    column: Tensor | None = None

    def keep(self, going: Tensor, rows: int) -> Tensor:
        """The rows where ``going`` [self.rows] bool first, ``rows`` in all (at least ``going.sum()``; the rest are
        stepped but not read): each stopped row among the first ``going.sum()`` takes a going one from after them (a
        copy of as many rows as stopped, filled columns only) -> the former index of each of the ``rows`` rows."""
        kept, n = int(going.sum()), self.length
        order = torch.arange(self.rows, device=going.device)
        holes, movers = (~going[:kept]).nonzero().squeeze(1), going[kept:].nonzero().squeeze(1) + kept
        self.kv[:, holes, :, :n] = self.kv[:, movers, :, :n]
        for x in (self.bias, self.positions, order):
            x[holes] = x[movers]
        self.rows = rows
        return order[:rows]

    def make_static(self) -> None:
        """The static form a CUDA graph replays: each step writes column ``column`` and attends over the whole width,
        the columns not yet written masked (-inf) and zeroed (unset memory may hold NaN, and 0 x NaN is NaN)."""
        self.kv[:, :, :, self.length :] = 0
        self.bias[:, self.length :] = float("-inf")
        self.column = torch.full((1,), self.length, device=self.kv.device)

    def visible(self) -> Tensor:
        """The additive mask of this step's attention [rows, 1, 1, n]: the filled columns and this step's (``n`` =
        ``length`` + 1), or in static form every column, those after this step's at -inf."""
        if self.column is None:
            return self.bias[: self.rows, None, None, : self.length + 1]
        self.bias.index_fill_(1, self.column, 0.0)
        return self.bias[: self.rows, None, None]

    def layer(self, i: int, key_value: Tensor) -> tuple[Tensor, Tensor]:
        """One token's keys and values ``key_value`` [rows, 2 kv_heads, head_dim] into column ``length`` of layer
        ``i`` -> the layer's keys and values as ``visible`` covers them, [rows, kv_heads, n, head_dim] each."""
        b, kv_heads = self.rows, self.kv.shape[2] // 2
        if self.column is None:
            self.kv[i, :b, :, self.length] = key_value
            return self.kv[i, :b, :kv_heads, : self.length + 1], self.kv[i, :b, kv_heads:, : self.length + 1]
        self.kv[i, :b].index_copy_(2, self.column, key_value[:, :, None])
        return self.kv[i, :b, :kv_heads], self.kv[i, :b, kv_heads:]

    def advance(self) -> None:
        """One column filled: the next token's position and column."""
        self.length += 1
        self.positions += 1
        if self.column is not None:
            self.column += 1


def decode(
    lm: nn.Module, ids: Tensor, mask: Tensor, sampling: Sampling, max_new_tokens: int, tokenizer, graphs: bool = False
):
    """Left-padded prompts ``ids``, ``mask`` [B, P] -> (responses [B, T] long, log-probs [B, T] float32), T the
    longest answer (at most ``max_new_tokens``), padding after a row's EOS.

    A row that emits EOS leaves the batch. ``graphs``: the step in static form (``Cache.make_static``) over a bucket
    of rows (``cuda_graphs.bucket``): a stopped row stays in its bucket, masked out of the answers, until the going
    ones fit the next bucket down; on CUDA each bucket's step is captured once and replayed (``GraphedStep``)."""
    first, run = runs(ids, mask)
    logits, cache = prefill(lm, ids[first], mask[first], run, ids.shape[1] + max_new_tokens)
    logits, eos, top = logits[run], tokenizer.eos_token_id, ids.shape[0]
    forward = partial(step, lm, cache=cache, fused=fused_layers(lm))
    if graphs:
        cache.make_static()
        forward = GraphedStep(forward, top, ids.device) if ids.is_cuda else forward
    live = torch.arange(top, device=ids.device)  # the answer row of each stepped cache row
    going = torch.ones(top, dtype=torch.bool, device=ids.device)  # which stepped rows have not stopped
    drawn = []  # each step's (rows, their tokens, their log-probs, going): written into the answers at the end
    for t in range(max_new_tokens):
        tokens, token_logp = pick(logits, sampling, live, top)
        drawn.append((live, tokens, token_logp, going))
        going = going & (tokens != eos)
        still = int(going.sum())
        if t == max_new_tokens - 1 or not still:
            break
        rows = bucket(still, top) if graphs else still
        if rows < cache.rows:
            order = cache.keep(going, rows)
            live, tokens = live[order], tokens[order]
            going = torch.arange(rows, device=ids.device) < still
        logits = forward(tokens)
        cache.advance()
    rows, tokens, token_logp, kept = (torch.cat(x) for x in zip(*drawn))
    steps = torch.arange(len(drawn), device=ids.device).repeat_interleave(
        torch.tensor([len(d[0]) for d in drawn], device=ids.device)
    )
    at = rows[kept], steps[kept]
    responses = ids.new_full((ids.shape[0], len(drawn)), tokenizer.pad_token_id).index_put_(at, tokens[kept])
    logp = torch.zeros(responses.shape, dtype=torch.float32, device=ids.device).index_put_(at, token_logp[kept])
    return responses, logp


def runs(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Runs of identical consecutive rows of ``ids``, ``mask`` [B, P] -> (the first row of each run [G], each row's
    run [B])."""
    same = (ids[1:] == ids[:-1]).all(1) & (mask[1:] == mask[:-1]).all(1)
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero().squeeze(1), starts.cumsum(0) - 1


def prefill(lm: nn.Module, ids: Tensor, mask: Tensor, run: Tensor, width: int) -> tuple[Tensor, Cache]:
    """Distinct prompts ``ids``, ``mask`` [G, P] through the model -> (the last position's logits [G, V] float32,
    the Cache of their ``run`` [B] rows: each row its prompt's keys and values, ``width`` columns in all)."""
    length, kv = ids.shape[1], []
    states, (cos, sin) = decoder.forward(lm, ids, mask, position_ids(mask), 0, width=width, kv=kv)
    bias = torch.zeros(ids.shape[0], width, dtype=states.dtype, device=ids.device)
    bias[:, :length].masked_fill_(~mask.bool(), float("-inf"))
    cached = widened([torch.cat(pair, 1) for pair in kv], run, width)
    cache = Cache(cached, bias[run], mask.sum(1)[run], cos, sin, rows=len(run), length=length)
    return lm.lm_head(states[:, -1]).float(), cache


def step(lm: nn.Module, tokens: Tensor, cache: Cache, fused: list[Fused] | None = None) -> Tensor:
    """The next token of every stepped row, ``tokens`` [b], through the model (``fused``: its layers' ``Fused``
    weights, run by ``fused_layer``) -> logits [b, V] float32; its keys and values join ``cache`` (whose
    ``advance`` is the caller's: a CUDA graph of this step reads no Python state)."""
    at = cache.positions[: cache.rows]
    x = lm.model.embed_tokens(tokens[:, None])  # [b, 1, H]
    angles = cache.cos[at][:, None, None], cache.sin[at][:, None, None]  # [b, 1, 1, D]
    bias = cache.visible()
    for i, layer in enumerate(lm.model.layers):
        if fused is not None:
            x = fused_layer(fused[i], i, x, cache, angles, bias)
            continue
        attention = layer.self_attn
        query, key, value = project(attention, norm(layer.input_layernorm, x), angles)
        key, value = cache.layer(i, torch.cat([key, value], 1)[:, :, 0])
        x = finish(layer, x, attend(query, key, value, bias, attention.scaling, attention.num_key_value_groups))
    return head(lm, x[:, -1])


def fused_layer(f: Fused, i: int, x: Tensor, cache: Cache, angles: tuple[Tensor, Tensor], bias: Tensor) -> Tensor:
    """Decoder layer ``i`` of ``step`` on its ``Fused`` weights, ``x`` [b, 1, H] -> [b, 1, H]: one matmul for query,
    key and value (the query's and key's heads rotated together), one for the MLP's gate and up, no module calls."""
    b, rotating = x.shape[0], f.heads + f.kv_heads
    out = linear(weighted_norm(x, f.input_norm, f.eps), f.qkv, f.qkv_bias).view(b, 1, rotating + f.kv_heads, -1)
    rope(out[:, :, :rotating], *angles, out=out[:, :, :rotating])  # the query's and key's heads, in place
    key, value = cache.layer(i, out[:, 0, f.heads :])  # the rotated key and the value: one write
    query = out[:, :, : f.heads].transpose(1, 2)
    x = x + linear(attend(query, key, value, bias, f.scale, f.heads // f.kv_heads), f.out, f.out_bias)
    gate, up = linear(weighted_norm(x, f.post_norm, f.eps), f.gate_up).chunk(2, -1)
    return x + linear(silu(gate) * up, f.down)


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


def pick(logits: Tensor, sampling: Sampling, rows: Tensor | None = None, top: int = 0) -> tuple[Tensor, Tensor]:
    """Next tokens [b] from ``logits`` [b, V] float32 and their log-probs [b] under the distribution drawn from
    (greedy: argmax, log-prob 0). A draw inverts the cumulative distribution at one uniform number u a row: the
    first token whose cumulative probability exceeds u (a token of probability 0 is never drawn). One random number
    a row, not one a token as ``torch.multinomial``'s exponential race draws: at a 32k vocabulary and 128 rows that
    race took 70 ms a token on one thread, this 7 ms.

    ``rows`` [b]: the chunk row of each logits row, of ``top``: u is drawn for all ``top`` rows and each row takes its
    own, so that a row's answer does not depend on when the others stopped (the same draws for a prompt in two arms
    of a study: common random numbers)."""
    if sampling.temperature == 0:
        return logits.argmax(-1), logits.new_zeros(logits.shape[0])
    scores = logits if sampling.temperature == 1 else logits / sampling.temperature  # x / 1 is x: one op fewer
    logp = truncated(scores, sampling.top_k, sampling.top_p).log_softmax(-1)
    uniform = logp.new_empty(max(top, len(logp))).uniform_()
    uniform = uniform[: len(logp)] if rows is None else uniform[rows]
    cumulative = logp.exp().cumsum(-1)
    at = (uniform * cumulative[:, -1])[:, None]  # the total is 1 up to rounding
    tokens = torch.searchsorted(cumulative, at, right=True).squeeze(1).clamp(max=logp.shape[1] - 1)
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
