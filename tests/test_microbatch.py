"""Micro-batches: a strict token cap, every row once, trimming that changes no log-prob, rows back in order."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny_llama

from rlx_cli.engine.logprobs import response_logp
from rlx_cli.engine.microbatch import MicroBatch, place, plan, split


def cost(rows: list[int], prompts: list[int], responses: list[int]) -> int:
    return len(rows) * (max(prompts[i] for i in rows) + max(responses[i] for i in rows))


def test_first_fit_decreasing_by_hand():
    # real lengths (prompt + response): 3+9=12, 2+2=4, 4+6=10, 2+1=3, 3+3=6; budget 24
    prompts, responses = [3, 2, 4, 2, 3], [9, 2, 6, 1, 3]
    # decreasing: row 0 (12) opens a bin; row 2 (10) with it would cost 2 x (4 + 9) = 26 > 24: a second bin;
    # row 4 (6) fits the first: 2 x (3 + 9) = 24; row 1 (4): the first would cost 3 x 12 = 36, the second
    # 2 x (4 + 6) = 20; row 3 (3): 36 and 3 x (4 + 6) = 30, both over: a third bin
    assert plan(prompts, responses, 24) == [[0, 4], [2, 1], [3]]


@pytest.mark.parametrize("budget", [1, 7, 20, 50, 1000])
def test_strict_cap_and_every_row_once(budget):
    gen = torch.Generator().manual_seed(budget)
    prompts = torch.randint(1, 8, (40,), generator=gen).tolist()
    responses = torch.randint(1, 30, (40,), generator=gen).tolist()
    bins = plan(prompts, responses, budget)
    assert sorted(i for b in bins for i in b) == list(range(40))
    for rows in bins:  # a row over the budget alone in its bin is the one exception
        assert cost(rows, prompts, responses) <= budget or len(rows) == 1


@pytest.fixture(scope="module")
def model_and_batch(tmp_path_factory):
    from transformers import LlamaForCausalLM

    from rlx_cli.engine.base_model import char_tokenizer
    from rlx_cli.sampling.rollout import HFSampler

    path = save_tiny_llama(tmp_path_factory.mktemp("m"), layers=1, heads=2, head_dim=16)
    model = LlamaForCausalLM.from_pretrained(path)
    torch.manual_seed(0)
    prompts = ["1,2:", "3,4,5,6,7:", "8:", "9,1,2:", "4,4,4,4,4,4,4:", "5,6:"]
    return model, HFSampler(char_tokenizer()).generate(model, prompts, temperature=1.0, max_new_tokens=12)


def test_trimmed_micro_batches_give_the_whole_batch_log_probs_in_row_order(model_and_batch):
    model, batch = model_and_batch
    with torch.no_grad():
        whole, _ = response_logp(model, batch, 0.9)
        micro = split(batch, 40)
        assert len(micro) > 2 and all(m.tokens <= 40 or len(m.rows) == 1 for m in micro)
        assert any(m.batch.input_ids.shape[1] < batch.input_ids.shape[1] for m in micro)  # some were trimmed
        parts = [response_logp(model, m.batch, 0.9)[0] for m in micro]
    assert torch.allclose(place(parts, micro, tuple(whole.shape)), whole, atol=1e-6)


def test_an_empty_stand_in_has_no_real_token(model_and_batch):
    _, batch = model_and_batch
    stand_in = MicroBatch.empty_like(split(batch, 40)[0])
    assert stand_in.padding and len(stand_in.rows) == 0 and stand_in.batch.response_mask.sum() == 0
    assert stand_in.batch.input_ids.shape[0] == 1
