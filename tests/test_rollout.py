import torch

from rlx_cli.engine.base_model import char_tokenizer
from rlx_cli.engine.batch import position_ids
from rlx_cli.sampling.rollout import response_mask


def test_response_mask_runs_up_to_and_including_the_first_eos():
    eos = 2
    responses = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 2, 7, 0], [5, 6, 7, 8, 9]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float)
    assert torch.equal(response_mask(responses, eos), expected)


def test_position_ids_skip_left_padding():
    attention = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids(attention).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_char_tokenizer_round_trip_with_bos():
    tok = char_tokenizer()
    ids = tok("12+3=15,#:")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 11
    assert tok.decode(ids, skip_special_tokens=True) == "12+3=15,#:"
    assert len(tok) <= 20


def test_answers_cut_at_the_budget_and_a_batch_without_them():
    from rlx_cli.engine.batch import Rollout, position_ids
    from rlx_cli.loops.loop import cut_short

    eos, pad = 2, 0
    # row 0 ends with EOS inside the budget of 4, row 1 is cut at 4 tokens, row 2 ends with EOS at the 4th token
    responses = torch.tensor([[5, 2, pad, pad], [5, 6, 7, 8], [5, 6, 7, 2]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]).float()
    prompts = torch.ones(3, 2, dtype=torch.long)
    attention = torch.cat([torch.ones_like(prompts), mask.long()], 1)
    batch = Rollout(torch.cat([prompts, responses], 1), attention, position_ids(attention), responses, mask, ["a"] * 3)
    cut = cut_short(batch, eos, max_new_tokens=4)
    assert cut.tolist() == [False, True, False]
    kept = batch.without_rows(cut)
    assert kept.response_mask.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert torch.equal(kept.attention_mask, batch.attention_mask)  # the row is still there, only out of the loss


def test_prompts_are_the_tokenizers_own_left_padding_each_distinct_one_tokenized_once(monkeypatch):
    from rlx_cli.sampling.rollout import HFSampler

    tok = char_tokenizer()
    prompts = ["12,3:", "12,3:", "4:", "4:", "7,8,9:"]
    tok.padding_side = "left"
    expected = tok(prompts, padding=True, return_tensors="pt")
    calls = []
    sampler = HFSampler(tok)
    monkeypatch.setattr(sampler, "tokenizer", lambda texts, **kw: calls.append(texts) or tok(texts, **kw))
    sampler.tokenizer.pad_token_id = tok.pad_token_id
    got = sampler.encode(prompts)
    assert calls == [["12,3:", "4:", "7,8,9:"]]
    assert torch.equal(got["input_ids"], expected["input_ids"])
    assert torch.equal(got["attention_mask"], expected["attention_mask"])
    with_prefixes = sampler.encode(prompts, [[5], [], [6, 7], [5], []])  # each row's prompt, then its prefix
    row = with_prefixes["input_ids"][2][with_prefixes["attention_mask"][2].bool()].tolist()
    assert row == tok("4:")["input_ids"] + [6, 7] and with_prefixes["input_ids"].shape[1] == 7  # "7,8,9:": BOS + 6
