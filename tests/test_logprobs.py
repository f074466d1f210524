"""Log-probs and entropy from the hidden states, in chunks, equal the plain path over the full logits; and take less
memory."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import save_tiny_llama
from torch import nn

from rlx_cli.engine import decoder, logprobs
from rlx_cli.engine.batch import Rollout
from rlx_cli.sampling.rollout import HFSampler


def plain_logp(model, batch: Rollout, temperature: float):
    """The path rlx had before: the model's own [B, L, V] logits, log-softmax, gather, entropy."""
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    start = batch.prompt_len - 1
    logits = logits[:, start : start + batch.responses.shape[1]].float() / temperature
    logprobs_all = logits.log_softmax(-1)
    logp = logprobs_all.gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    mask = batch.response_mask
    return logp * mask, entropy * mask


def model_and_batch(tmp_path, *, tie: bool, lora: list[str] | None):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    path = save_tiny_llama(tmp_path / "m", layers=2, heads=2, head_dim=16, tie=tie)
    model = LlamaForCausalLM.from_pretrained(path)
    if lora:
        config = LoraConfig(r=4, lora_alpha=8, target_modules=lora, init_lora_weights=False)
        model = get_peft_model(model, config)
    from rlx_cli.engine.base_model import char_tokenizer

    torch.manual_seed(0)
    prompts = ["1,2:", "3,4,5:", "6,7,8,9:", "2:"]
    batch = HFSampler(char_tokenizer()).generate(model, prompts, temperature=1.0, max_new_tokens=10)
    return model, batch


@pytest.mark.parametrize(
    ("tie", "lora"),
    [(True, None), (False, None), (False, ["q_proj", "v_proj"]), (False, ["q_proj", "lm_head"]), (True, ["v_proj"])],
    ids=["tied", "untied", "lora", "lora-on-the-head", "tied-lora"],
)
def test_chunked_path_equals_the_full_logits(tmp_path, monkeypatch, tie, lora):
    monkeypatch.setattr(logprobs, "LOGITS_PER_CHUNK", 3 * 20)  # 3 tokens a chunk: several chunks, recomputed
    model, batch = model_and_batch(tmp_path, tie=tie, lora=lora)
    assert decoder.trains(logprobs.causal_lm(model))  # rlx's own forward (engine/decoder.py) against the model's
    assert batch.response_mask.sum() > 3 * 4  # more tokens than one chunk holds
    compare_grads(model, batch, 0.7)


def compare_grads(model, batch: Rollout, temperature: float) -> None:
    """``response_logp``'s log-probs, entropies and gradients equal ``plain_logp``'s."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(2, *batch.response_mask.shape, generator=torch.Generator().manual_seed(3))
    results = []
    for path in (plain_logp, lambda m, b, t: logprobs.response_logp(m, b, t, with_entropy=True)):
        logp, entropy = path(model, batch, temperature)
        loss = (weights[0] * logp).sum() + (weights[1] * entropy).sum()
        results.append((logp.detach(), entropy.detach(), torch.autograd.grad(loss, trainable)))
    (logp_a, ent_a, grads_a), (logp_b, ent_b, grads_b) = results
    assert torch.allclose(logp_a, logp_b, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ent_a, ent_b, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_a, grads_b):
        assert (a - b).abs().max() <= 1e-5 * a.abs().max() + 1e-7


@pytest.mark.parametrize("checkpointing", [False, True], ids=["own-forward", "checkpointed"])
def test_a_qwen2_trains_through_rlxs_forward_as_through_its_own(checkpointing):
    """A Qwen2 (grouped-query attention, biased projections), prompts of different lengths: rlx's forward, whose last
    layer skips the prompt's positions, gives its own forward's log-probs and gradients; with activation
    checkpointing too (rlx recomputes its own layers; tests/test_compiled_update.py)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlx_cli.engine.base_model import char_tokenizer
    from rlx_cli.engine.models import training_mode

    tok = char_tokenizer()
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    arch = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, head_dim=16)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=20, num_key_value_heads=2, **arch, **special))
    batch = HFSampler(tok).generate(model, ["1,2:", "3,4,5,6:", "7:"], temperature=1.0, max_new_tokens=8)
    training_mode(model, checkpointing=checkpointing)
    assert decoder.trains(model)
    assert batch.attention_mask[:, : batch.prompt_len].eq(0).any()  # left padding in the prompts
    compare_grads(model, batch, 0.7)


def test_padding_rows_and_no_token_at_all(tmp_path):
    model, batch = model_and_batch(tmp_path, tie=True, lora=None)
    batch.response_mask[1:] = 0  # only the first row has response tokens
    logp, entropy = logprobs.response_logp(model, batch, 1.0, with_entropy=True)
    assert logp[1:].abs().sum() == 0 and entropy[1:].abs().sum() == 0 and logp[0].abs().sum() > 0
    batch.response_mask.zero_()
    logp, _ = logprobs.response_logp(model, batch, 1.0)
    assert logp.shape == batch.responses.shape and logp.abs().sum() == 0


MEMORY = """
import resource, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from rlx_cli.engine.logprobs import response_logp
from rlx_cli.engine.batch import Rollout, position_ids
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)
model = LlamaForCausalLM(config)
rows, prompt, response = 8, 8, 512  # 4,096 response tokens
ids = torch.randint(3, 32000, (rows, prompt + response))
attention = torch.ones_like(ids)
batch = Rollout(ids, attention, position_ids(attention), ids[:, prompt:], torch.ones(rows, response), [""] * rows)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if sys.argv[1] == "plain":
    sys.path.insert(0, sys.argv[2])
    from test_logprobs import plain_logp
    logp, entropy = plain_logp(model, batch, 1.0)
else:
    logp, entropy = response_logp(model, batch, 1.0, with_entropy=True)
(logp.sum() + 0.01 * entropy.sum()).backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""


# glibc serves large blocks from its heap once its dynamic mmap threshold has risen, and the heap's free space
# stays resident: without a fixed threshold the chunked path's peak RSS read 1.3 GiB in one run of four here
# (0.2 GiB in the others). A fixed threshold returns every freed large block, so RSS follows the live tensors.
ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}


@pytest.mark.slow
def test_peak_memory_of_one_forward_and_backward_is_below_a_third(tmp_path):
    """V = 32k, 4,096 response tokens: the peak RSS growth of one forward + backward, each path in a fresh process."""
    tests_dir = str(__import__("pathlib").Path(__file__).parent)
    peak = {}
    run = [sys.executable, "-c", MEMORY]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    # both at once, one thread each: a process's peak RSS is its own
    procs = {path: subprocess.Popen([*run, path, tests_dir], **pipes) for path in ("plain", "chunked")}
    for path, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        peak[path] = float(stdout.split()[-1])
    print(f"peak RSS growth: plain {peak['plain']:.0f} MiB, chunked {peak['chunked']:.0f} MiB")
    assert peak["chunked"] < peak["plain"] / 3


def test_a_large_vocabulary_gets_chunks_of_min_chunk_rows_tokens_on_a_gpu_and_by_bytes_on_the_cpu():
    """At Qwen2.5's vocabulary LOGITS_PER_CHUNK alone gives 27-token chunks: the CPU keeps them (its time follows the
    head's arithmetic, its memory the chunk's), a GPU runs the head on MIN_CHUNK_ROWS tokens at once."""
    assert logprobs.chunk_rows(151_936, torch.device("cuda")) == 1024
    assert logprobs.chunk_rows(151_936, torch.device("cpu")) == 2**22 // 151_936 == 27
    assert logprobs.chunk_rows(32_000, torch.device("cpu")) == 131
    assert logprobs.chunk_rows(100, torch.device("cuda")) == logprobs.chunk_rows(100, torch.device("cpu")) == 41_943
    calls = []
    head = nn.Linear(8, 151_936, bias=False)
    counted = lambda module, args: calls.append(args[0].shape[0])  # noqa: E731
    head.register_forward_pre_hook(counted)
    hidden, targets = torch.randn(2_500, 8), torch.randint(0, 151_936, (2_500,))
    with torch.no_grad():
        logprobs.head_logp(hidden, head, targets, 1.0)
    assert calls == [27] * 92 + [16]  # 2,500 = 92 x 27 + 16
