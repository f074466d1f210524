"""The sampler's own log-probs, rollout correction in a run, and the behaviour policy (rollout.lag, rollout.dtype)."""

from __future__ import annotations

import pytest
import torch
from conftest import SHORT

from components import rollout_correction as rc
from rlx_cli.engine.base_model import VOCAB_SIZE, char_tokenizer
from rlx_cli.engine.behaviour import Behaviour
from rlx_cli.engine.logprobs import response_logp
from rlx_cli.sampling.rollout import HFSampler

PROMPTS = ["12+7=", "3+4+5=", "40+2=", "9+9+9+9="]


def random_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = char_tokenizer()
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=VOCAB_SIZE, max_position_embeddings=128,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    return LlamaForCausalLM(config).eval(), tok


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_hf_sampler_returns_the_log_probs_of_the_distribution_it_sampled(top_p):
    model, tok = random_llama()
    torch.manual_seed(1)
    batch = HFSampler(tok, top_p=top_p).generate(model, PROMPTS * 8, temperature=0.7, max_new_tokens=24)
    with torch.no_grad():
        forward, _ = response_logp(model, batch, 0.7)
    real = batch.response_mask.bool()
    gap = (batch.sampler_logp - forward)[real]
    if top_p == 1.0:  # the same distribution: equal to float32 rounding, so TIS weights are 1
        assert gap.abs().max() < 1e-5
        weights, _ = rc.tis(forward, batch.sampler_logp, batch.response_mask, cap=2.0)
        assert (weights[real] - 1).abs().max() < 1e-5
    else:  # the truncated nucleus gives each kept token more mass than the full softmax
        assert (gap > -1e-5).all() and gap.max() > 0.01
    assert (batch.sampler_logp[~real] == 0).all()


def test_a_greedy_answer_carries_no_sampler_log_probs():
    model, tok = random_llama()
    assert HFSampler(tok).generate(model, PROMPTS, temperature=0.0, max_new_tokens=8).sampler_logp is None


def test_the_behaviour_copy_samples_with_the_weights_of_lag_updates_ago_and_round_trips():
    model, _ = random_llama()
    behaviour = Behaviour(model, lag=2, dtype="bf16")
    weight = model.model.embed_tokens.weight
    seen = []
    for version in range(5):  # version v: the policy after v updates
        with torch.no_grad():
            weight.fill_(float(version))
        copy = behaviour.refresh(model)
        seen.append(copy.model.embed_tokens.weight[0, 0].item())
    assert seen == [0.0, 0.0, 0.0, 1.0, 2.0] and copy.model.embed_tokens.weight.dtype == torch.bfloat16
    restored = Behaviour(model, lag=2, dtype="bf16")
    restored.load_state(behaviour.state())
    with torch.no_grad():
        weight.fill_(5.0)
    assert restored.refresh(model).model.embed_tokens.weight[0, 0].item() == 3.0


@pytest.mark.slow
def test_tis_weights_are_one_when_the_sampler_is_the_trainer(workdir):
    from rlx_cli.loops.run import train_command

    final = train_command([*SHORT, "rollout_correction=tis", "trainer.minibatches=2", "tracking=none"])
    weights = final["train/rollout_is_weight_max"], final["train/rollout_is_weight_mean"]
    assert all(abs(w - 1) < 1e-5 for w in weights), weights
    assert final["train/rollout_is_truncated_frac"] == 0.0 and final["train/sampler_logp_gap_max"] < 1e-4


@pytest.mark.slow
def test_a_stale_bf16_sampler_shows_in_the_rollout_metrics(workdir):
    from rlx_cli.loops.run import train_command

    final = train_command([*SHORT, "rollout.lag=1", "rollout.dtype=bf16", "rollout_correction=mis", "tracking=none"])
    assert final["train/rollout_kl"] > 1e-6 and final["train/sampler_logp_gap_max"] > 1e-3
    assert 0.0 <= final["train/rollout_is_masked_frac"] < 0.5
