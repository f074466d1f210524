"""rollout.cuda_graphs: the decode step in static form over buckets of rows gives the eager loop's answers (on the CPU,
uncaptured), stepping down a bucket as soon as the going rows fit it; on a GPU (skipped without one) the captured and
replayed step gives the eager path's greedy tokens, and sampled log-probs a bf16 forward's to bf16 tolerance."""

from __future__ import annotations

import pytest
import torch
from test_fast_sampler import GREEDY, TOKENIZER, base_dir, prompts, qwen2_model, small_model  # noqa: F401

from rlx_cli.engine.logprobs import response_logp
from rlx_cli.engine.precision import copy_in_dtype
from rlx_cli.sampling import fast_rollout
from rlx_cli.sampling.cuda_graphs import GraphedStep, bucket, enabled
from rlx_cli.sampling.fast_rollout import Cache, FastSampler

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
STEP, CAPTURE = fast_rollout.step, GraphedStep.capture  # the originals, which the spies below wrap


def test_a_bucket_is_the_smallest_power_of_two_that_holds_the_going_rows_at_most_the_loops_rows():
    assert [bucket(n, 256) for n in (256, 200, 129, 128, 65, 64, 3, 2, 1)] == [256, 256, 256, 128, 128, 64, 4, 2, 1]
    assert [bucket(n, 200) for n in (200, 129, 128, 5)] == [200, 200, 128, 8]  # the loop's own rows on top


def test_auto_is_on_cuda_only():
    assert [enabled(s, torch.device("cpu")) for s in ("auto", True, False)] == [False, True, False]
    assert [enabled(s, torch.device("cuda")) for s in ("auto", True, False)] == [True, True, False]


def numbered_cache(rows: int = 6, width: int = 5, length: int = 3) -> Cache:
    """A cache whose row i holds i everywhere (keys, values, bias, position), ``length`` columns filled."""
    ids = torch.arange(rows, dtype=torch.float32)
    kv = ids[None, :, None, None, None].expand(2, rows, 2, width, 4).clone()
    cos = sin = torch.ones(width, 4)
    return Cache(kv, ids[:, None].expand(rows, width).clone(), torch.arange(rows), cos, sin, rows, length)


def test_keep_moves_the_going_rows_first_and_steps_the_buckets_rows():
    cache = numbered_cache()
    going = torch.tensor([True, False, True, False, False, True])
    order = cache.keep(going, 4)  # 3 going rows in a bucket of 4: rows 0, 5 (into 1's place), 2, then row 3
    assert order.tolist() == [0, 5, 2, 3] and cache.rows == 4
    assert cache.kv[0, :4, 0, :3, 0].tolist() == [[0] * 3, [5] * 3, [2] * 3, [3] * 3]  # filled columns copied
    assert cache.kv[0, 1, 0, 3:, 0].tolist() == [1, 1]  # ... only those
    assert cache.positions[:4].tolist() == [0, 5, 2, 3] and cache.bias[1].tolist() == [5] * 5


def test_the_static_form_masks_and_zeroes_the_columns_not_yet_written():
    """Unset cache memory may hold NaN: attention over the whole width must read zeros there, with no weight."""
    cache = numbered_cache()
    cache.kv[:, :, :, 3:] = float("nan")
    cache.make_static()
    assert cache.kv[:, :, :, 3:].eq(0).all() and cache.bias[:, 3:].eq(float("-inf")).all()
    assert cache.column.tolist() == [3]
    cache.rows = 2
    mask = cache.visible()  # this step's column opens
    assert mask.shape == (2, 1, 1, 5) and mask[0, 0, 0].tolist() == [0, 0, 0, 0, float("-inf")]
    key, value = cache.layer(1, torch.full((2, 2, 4), 7.0))
    assert key.shape == value.shape == (2, 1, 5, 4) and key[:, :, 3].eq(7).all() and cache.kv[1, 2:, :, 3].eq(0).all()
    cache.advance()
    assert cache.column.tolist() == [4] and cache.length == 4 and cache.positions[:2].tolist() == [1, 2]


def stepped_rows(monkeypatch) -> list[int]:
    """The rows of each decode step the loop runs (``fast_rollout.step``'s cache rows), recorded."""
    rows = []

    def step(lm, tokens, cache, fused=None):
        assert tokens.shape[0] == cache.rows
        rows.append(cache.rows)
        return STEP(lm, tokens, cache, fused)

    monkeypatch.setattr(fast_rollout, "step", step)
    return rows


@pytest.mark.parametrize("case", ["sums", "shortcut_sums", "qwen2", "lora"])
def test_static_buckets_give_the_eager_loops_answers_and_step_down_when_the_rows_fit(case, base_dir, monkeypatch):  # noqa: F811
    """Greedy answers of every length (shortcut_sums' shape), GQA with biases, LoRA's wrappers: the static loop's
    answers are the eager loop's token for token; each step runs the bucket of the rows still going (the eager loop
    exactly those rows)."""
    make, terms, budget = GREEDY[case]
    model, texts = make(base_dir), prompts(*terms)
    answers, rows = {}, {}
    for graphs in (False, True):
        rows[graphs] = stepped_rows(monkeypatch)
        answers[graphs] = FastSampler(TOKENIZER, cuda_graphs=graphs).generate(
            model, texts, temperature=0, max_new_tokens=budget
        )
    assert torch.equal(answers[True].input_ids, answers[False].input_ids)
    lengths = answers[False].response_mask.sum(1)
    going = [int((lengths > k + 1).sum()) for k in range(int(lengths.max()) - 1)]  # after each step's token
    assert rows[False] == going
    assert rows[True] == [bucket(n, len(texts)) for n in going]
    if case == "shortcut_sums":
        assert len(set(rows[True])) >= 3  # answers of every length: several buckets down


def test_static_sampled_logp_are_a_teacher_forced_forwards():
    """In static form too each sampled token's log-prob is the trainer's temperature-scaled log-softmax, to 1e-5."""
    model = small_model(None)
    torch.manual_seed(0)
    batch = FastSampler(TOKENIZER, cuda_graphs=True).generate(model, prompts(3, 8), temperature=0.7, max_new_tokens=64)
    expected, _ = response_logp(model, batch, 0.7)
    real = batch.response_mask.bool()
    assert batch.response_mask.sum(1).unique().numel() > 3  # rows stopped inside buckets
    assert torch.allclose(batch.sampler_logp[real], expected[real], atol=1e-5, rtol=0)


def captures(monkeypatch) -> list[int]:
    """The rows of each CUDA graph captured, recorded."""
    rows = []

    def capture(self, b):
        rows.append(b)
        return CAPTURE(self, b)

    monkeypatch.setattr(GraphedStep, "capture", capture)
    return rows


@CUDA
@pytest.mark.parametrize("make", [small_model, qwen2_model], ids=["llama", "qwen2"])
def test_graphs_give_the_eager_greedy_tokens_on_a_gpu(make, monkeypatch):
    model = make(None).cuda()
    texts = prompts(3, 8)
    eager = FastSampler(TOKENIZER, cuda_graphs=False).generate(model, texts, temperature=0, max_new_tokens=64)
    captured = captures(monkeypatch)
    graphed = FastSampler(TOKENIZER, cuda_graphs="auto").generate(model, texts, temperature=0, max_new_tokens=64)
    assert torch.equal(graphed.input_ids, eager.input_ids)
    assert captured and captured == sorted(set(captured), reverse=True)  # once per bucket, going down


@CUDA
def test_graphed_sampled_logp_are_a_bf16_forwards_to_bf16_tolerance(monkeypatch):
    """A bf16 copy samples through the graphs; each token's log-prob is the trainer's bf16 forward's within bf16
    rounding (on the CPU both paths were within 0.004 of it; the eager path is held to the same bound)."""
    model = copy_in_dtype(small_model(None), torch.bfloat16).cuda().eval()
    for graphs in (False, True):
        captured = captures(monkeypatch)
        torch.manual_seed(0)
        batch = FastSampler(TOKENIZER, cuda_graphs=graphs).generate(
            model, prompts(3, 8), temperature=1.0, max_new_tokens=64
        )
        assert bool(captured) is graphs
        with torch.no_grad():
            expected, _ = response_logp(model, batch, 1.0)
        real = batch.response_mask.bool()
        gap = (batch.sampler_logp[real] - expected[real]).abs()
        assert gap.max() < 0.05 and gap.mean() < 0.01, (graphs, gap.max(), gap.mean())
