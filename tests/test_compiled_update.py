"""The update's forward under activation checkpointing and ``trainer.compile``: rlx's own training forward recomputes
its own layer function in backward, with the values and gradients of the forward that keeps its activations and of
transformers' checkpointed forward; compiled (``torch.compile``) it gives the eager values and gradients in float32 to
1e-5. A model whose layers are FSDP units still runs its own forward."""

from __future__ import annotations

import pytest
import torch
from test_logprobs import compare_grads

from rlx_cli.engine import decoder
from rlx_cli.engine.base_model import char_tokenizer
from rlx_cli.engine.logprobs import Scorer, causal_lm
from rlx_cli.engine.models import training_mode
from rlx_cli.sampling.rollout import HFSampler

LAYERS = 3


def qwen2_and_batch(lora: bool):
    """A random Qwen2 (grouped-query attention, biased projections; LoRA on the query, value and gate projections,
    moved off zero) and a sampled batch of prompts of different lengths."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = char_tokenizer()
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    arch = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4, head_dim=16)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), num_key_value_heads=2, **arch, **special))
    if lora:
        targets = ["q_proj", "v_proj", "gate_proj"]
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    batch = HFSampler(tok).generate(model, ["1,2:", "3,4,5,6:", "7:", "8,9:"], temperature=1.0, max_new_tokens=8)
    return model, batch


def loss_and_grads(model, batch, *, compiled: bool = False):
    """A loss on the response log-probs and entropies of ``batch`` under rlx's training forward -> (the loss, its
    gradients by trainable parameter, the bytes autograd kept from the forward outside recomputed regions)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(2, *batch.response_mask.shape, generator=torch.Generator().manual_seed(3))
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.nbytes) or t, lambda t: t):
        logp, entropy = Scorer(model, compiled=compiled)(batch, 0.7, with_entropy=True)
        loss = (weights[0] * logp).sum() + (weights[1] * entropy).sum()
    return loss.detach(), torch.autograd.grad(loss, trainable), sum(kept)


def layer_calls(monkeypatch) -> list[int]:
    """Calls of ``decoder.layer`` (rlx's layer function), recorded."""
    calls, inner = [], decoder.layer
    monkeypatch.setattr(decoder, "layer", lambda *args: calls.append(1) or inner(*args))
    return calls


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpointed_own_forward_recomputes_its_layers_with_the_same_values_and_gradients(lora, monkeypatch):
    model, batch = qwen2_and_batch(lora)
    lm, results = causal_lm(model), {}
    for checkpointing in (False, True):
        training_mode(lm, checkpointing=checkpointing)
        assert decoder.trains(lm) and all(decoder.recomputes(layer) is checkpointing for layer in lm.model.layers)
        calls = layer_calls(monkeypatch)
        results[checkpointing] = loss_and_grads(model, batch)
        assert len(calls) == LAYERS * (2 if checkpointing else 1)  # each layer run again in backward
        monkeypatch.undo()
    (loss, grads, kept), (loss_c, grads_c, kept_c) = results[False], results[True]
    assert kept_c < kept / 3  # the layers' activations were not kept
    assert torch.equal(loss_c, loss)
    for a, b in zip(grads, grads_c):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)
    compare_grads(model, batch, 0.7)  # against transformers' own forward, checkpointed by transformers


def test_a_model_whose_layers_are_fsdp_units_runs_its_own_forward(tmp_path):
    """FSDP2 gathers a unit's parameters in hooks on the unit's forward, which rlx's forward does not call."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    model, _ = qwen2_and_batch(False)
    training_mode(model, checkpointing=True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert decoder.trains(model)
        fully_shard(model.model.layers[1])
        assert not decoder.trains(model)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("lora", "checkpointing"), [(False, False), (True, True)], ids=["full", "lora-checkpointed"])
def test_compiled_layers_give_the_eager_loss_and_gradients(lora, checkpointing):
    """``trainer.compile``: the layer function through ``torch.compile`` (inductor; about a minute to compile here),
    with no graph break; float32 loss and gradients equal the eager forward's to 1e-5."""
    from torch._dynamo.utils import counters

    model, batch = qwen2_and_batch(lora)
    training_mode(causal_lm(model), checkpointing=checkpointing)
    loss, grads, _ = loss_and_grads(model, batch)
    counters.clear()
    loss_c, grads_c, _ = loss_and_grads(model, batch, compiled=True)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert torch.allclose(loss_c, loss, rtol=1e-5, atol=0)
    for a, b in zip(grads, grads_c):
        assert (a - b).abs().max() <= 1e-5 * a.abs().max() + 1e-8


def test_the_keys_reach_the_forward_and_the_sampler(tmp_path):
    """``trainer.compile`` and ``rollout.cuda_graphs`` as a run builds them (no forward: compiling takes a while)."""
    from conftest import save_tiny_llama

    from rlx_cli.config.compose import compose, job_config
    from rlx_cli.loops.build import build
    from rlx_cli.loops.progress import Progress

    path = save_tiny_llama(tmp_path, layers=1, heads=1, head_dim=32)
    for compiled, graphs in ((True, False), (False, "auto")):
        settings = ["model=hf", f"model.path={path}", f"trainer.compile={compiled}", f"rollout.cuda_graphs={graphs}"]
        parts = build(job_config(compose([*settings, "trainer.threads=1"])), Progress(silent=True))
        assert parts.models.scorer.compiled is compiled and parts.models.reference_scorer.compiled is compiled
        assert parts.sampler.cuda_graphs == graphs
