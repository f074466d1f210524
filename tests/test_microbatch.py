"""Micro-batches: a strict token cap, every row once, trimming that changes no log-prob, rows back in order."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import save_tiny_llama

from rlx_cli.engine import microbatch
from rlx_cli.engine.logprobs import response_logp
from rlx_cli.engine.microbatch import MicroBatch, place, plan, split


def cost(rows: list[int], prompts: list[int], responses: list[int]) -> int:
    return len(rows) * (max(prompts[i] for i in rows) + max(responses[i] for i in rows))


def test_rows_of_like_length_share_a_micro_batch_when_padding_costs_more_than_a_micro_batch(monkeypatch):
    monkeypatch.setattr(microbatch, "MICRO_BATCH_COST", 4)
    # two answers of 8 tokens, two of 2, prompts of 2, budget 40: all four in one micro-batch fit (4 x 10 = 40
    # tokens) but cost 40 + 4 = 44; by length, 2 x 10 + 2 x 4 + 2 x 4 = 36; [8, 8, 2] + [2]: 30 + 4 + 8 = 42
    assert plan([2, 2, 2, 2], [2, 8, 2, 8], 40) == [[1, 3], [0, 2]]
    monkeypatch.setattr(microbatch, "MICRO_BATCH_COST", 40)  # now one more micro-batch costs more than the padding
    assert plan([2, 2, 2, 2], [2, 8, 2, 8], 40) == [[1, 3, 0, 2]]


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_costs_the_least_of_every_cut_of_the_sorted_rows(monkeypatch, seed):
    gen = torch.Generator().manual_seed(seed)
    monkeypatch.setattr(microbatch, "MICRO_BATCH_COST", int(torch.randint(0, 30, (1,), generator=gen)))
    prompts = torch.randint(1, 8, (9,), generator=gen).tolist()
    responses = torch.randint(1, 30, (9,), generator=gen).tolist()
    budget = int(torch.randint(20, 200, (1,), generator=gen))
    order = sorted(range(9), key=lambda i: -(prompts[i] + responses[i]))

    def total(runs):  # None: a run over the budget that is not a single row
        costs = [cost(rows, prompts, responses) for rows in runs]
        if any(c > budget and len(rows) > 1 for c, rows in zip(costs, runs)):
            return None
        return sum(costs) + microbatch.MICRO_BATCH_COST * len(runs)

    every = []  # all 2^8 ways to cut the sorted rows into runs, by brute force
    for cuts in itertools.product([False, True], repeat=8):
        bounds = [0] + [k + 1 for k, c in enumerate(cuts) if c] + [9]
        every.append(total([order[a:b] for a, b in itertools.pairwise(bounds)]))
    assert total(plan(prompts, responses, budget)) == min(t for t in every if t is not None)


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
