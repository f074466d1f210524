"""A bfloat16 copy of a model (the full fine-tune's reference, the ``rollout.dtype=bf16`` sampler) computes what
transformers' own ``from_pretrained(..., dtype=torch.bfloat16)`` model of the same weights computes, bit for bit on
the CPU, at every position up to 512; and ``rollout=fast`` refuses a model whose forward hooks it would not run."""

from __future__ import annotations

import pytest
import torch
from conftest import SHORT, save_tiny_llama

from rlx_cli.config.compose import compose
from rlx_cli.config.errors import UserError
from rlx_cli.engine.batch import Rollout, position_ids
from rlx_cli.engine.behaviour import Behaviour
from rlx_cli.engine.logprobs import Scorer
from rlx_cli.engine.models import build_models
from rlx_cli.sampling.fast_rollout import FastSampler, check_architecture
from rlx_cli.sampling.rollout import HFSampler

POSITIONS = 512


def save_qwen2(path):
    """A random Qwen2 (biased query, key and value projections, grouped-query attention, untied head) of 512
    positions, saved with the character tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlx_cli.engine.base_model import char_llama_config, char_tokenizer

    llama = char_llama_config({}, tie=False, max_positions=POSITIONS)
    config = Qwen2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=POSITIONS, vocab_size=llama.vocab_size, tie_word_embeddings=False,
        bos_token_id=llama.bos_token_id, eos_token_id=llama.eos_token_id, pad_token_id=llama.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen2":
        return save_qwen2(path)
    from transformers import LlamaForCausalLM

    from rlx_cli.engine.base_model import char_llama_config, char_tokenizer

    arch = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1)
    torch.manual_seed(0)
    LlamaForCausalLM(char_llama_config(arch, tie=True, max_positions=POSITIONS)).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def long_batch(vocab: int) -> Rollout:
    """Two rows over all 512 positions: a left-padded prompt of 12 (and 9) tokens, then 500 response tokens."""
    torch.manual_seed(1)
    prompt, answer = 12, POSITIONS - 12
    ids = torch.randint(4, vocab, (2, prompt + answer))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    responses = ids[:, prompt:]
    return Rollout(ids, mask, position_ids(mask), responses, torch.ones(responses.shape), ["", ""])


def transformers_logp(model, batch: Rollout) -> torch.Tensor:
    """Response log-probs [B, T] by transformers' own forward (full logits), in float32."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits  # fmt: skip
    start = batch.prompt_len - 1
    picked = logits[:, start : start + batch.responses.shape[1]].float().log_softmax(-1)
    return picked.gather(-1, batch.responses[..., None]).squeeze(-1)


def test_bf16_reference_and_behaviour_copies_equal_transformers_bf16_model(model_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    cfg = compose(["model.finetune=full", "model.dtype=auto"])
    models = build_models(model_dir, cfg.model, needs_critic=False, critic_cfg=cfg.critic, precision="bf16-mixed")
    behaviour = Behaviour(models.policy, lag=0, dtype="bf16").refresh(models.policy).eval()
    expected = dict(hf.state_dict()) | dict(hf.named_buffers())
    batch = long_batch(hf.config.vocab_size)
    want = transformers_logp(hf, batch)
    with torch.no_grad():
        want_rlx, _ = Scorer(hf)(batch)  # rlx's own training forward over transformers' model
    assert (want_rlx - want).abs().max() < 1e-3  # rlx's forward against transformers': bf16 rounding apart
    for copy in (models.reference, behaviour):
        held = dict(copy.state_dict()) | dict(copy.named_buffers())
        assert held["model.rotary_emb.inv_freq"].dtype == torch.float32  # as transformers keeps it
        assert {k: v.dtype for k, v in held.items()} == {k: v.dtype for k, v in expected.items()}
        assert all(torch.equal(held[k], v) for k, v in expected.items())
        assert torch.equal(transformers_logp(copy, batch), want)
        with torch.no_grad():
            rlx_logp, _ = Scorer(copy)(batch)  # rlx's own training forward over the copy
        assert torch.equal(rlx_logp, want_rlx)


def test_a_plain_cast_rounds_the_rotary_frequencies_that_the_copy_keeps(model_dir):
    """What the copy fixes: ``.to(bfloat16)`` also casts ``inv_freq``, and log-probs drift with the position."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    cast = AutoModelForCausalLM.from_pretrained(model_dir).to(torch.bfloat16).eval()
    batch = long_batch(hf.config.vocab_size)
    gap = (transformers_logp(cast, batch) - transformers_logp(hf, batch)).abs()
    assert cast.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    assert gap.max() > 1e-4  # small on random weights (near-uniform outputs); 0.2-0.36 nats on trained ones


def test_bf16_true_starts_with_zero_kl_to_its_reference(workdir):
    from rlx_cli.loops.run import train_command

    final = train_command([*SHORT, "trainer.steps=1", "trainer.precision=bf16-true", "tracking=none",
                           "kl=estimate", "kl.coef=0.01"])  # fmt: skip
    assert final["train/kl"] == 0.0  # the policy and its reference hold the same weights at step 0


@pytest.fixture
def hooked_model(tmp_path):
    path = save_tiny_llama(tmp_path, layers=2, heads=2, head_dim=16)
    cfg = compose(["model=hf", f"model.path={path}", "model.finetune=full"])
    models = build_models(path, cfg.model, needs_critic=False, critic_cfg=cfg.critic)
    calls = []
    models.policy.model.layers[1].mlp.register_forward_hook(lambda module, args, out: calls.append(1) or out * 2)
    return models, calls


def test_the_fast_sampler_refuses_a_hooked_model_naming_the_module(hooked_model):
    models, _ = hooked_model
    with pytest.raises(UserError) as error:
        check_architecture(models.policy)
    message = str(error.value)
    assert "forward hook on model.layers.1.mlp" in message and "rollout=hf" in message
    assert len(message.splitlines()) == 1


def test_a_hooked_model_samples_under_rollout_hf_with_its_hook(hooked_model):
    models, calls = hooked_model
    torch.manual_seed(0)
    batch = HFSampler(models.tokenizer).generate(models.policy, ["1,2:"], temperature=1.0, max_new_tokens=4)
    assert batch.responses.shape[0] == 1 and calls  # the hook ran in every forward


def test_checkpointing_and_fsdp_hooks_do_not_count_as_the_users(tmp_path):
    """transformers' own hook under activation checkpointing leaves the embeddings' numbers alone: still fast."""
    path = save_tiny_llama(tmp_path, layers=1, heads=1, head_dim=32)
    cfg = compose(["model=hf", f"model.path={path}", "model.activation_checkpointing=true"])
    models = build_models(path, cfg.model, needs_critic=False, critic_cfg=cfg.critic)
    assert any(m._forward_hooks for m in models.policy.modules())
    check_architecture(models.policy)
    FastSampler(models.tokenizer).generate(models.policy, ["1,2:"], temperature=0.0, max_new_tokens=3)
