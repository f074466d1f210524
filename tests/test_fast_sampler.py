"""rollout=fast: transformers' ``generate`` answers token for token (greedy), log-probs a teacher-forced forward
gives, the distribution rollout=hf draws from; and its parts by hand. Runs and resumes: test_determinism.py and
test_checkpoint.py."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlx_cli.config.compose import compose
from rlx_cli.config.errors import UserError
from rlx_cli.engine.base_model import char_llama_config, char_tokenizer
from rlx_cli.engine.logprobs import response_logp
from rlx_cli.engine.models import build_models
from rlx_cli.sampling.fast_rollout import FastSampler, check_architecture, runs, truncated
from rlx_cli.sampling.rollout import HFSampler
from rlx_cli.sampling.tasks import SumsTask

TOKENIZER = char_tokenizer()
# model=small's arch (long_sums and the shortcut tasks)
SMALL = dict(
    hidden_size=96,
    intermediate_size=384,
    num_hidden_layers=3,
    num_attention_heads=3,
    num_key_value_heads=3,
    head_dim=32,
)


def prompts(min_terms: int, max_terms: int, groups: int = 16, size: int = 4) -> list[str]:
    """``groups`` sums prompts, each ``size`` times in a row, as the loop passes them."""
    task = SumsTask(min_terms=min_terms, max_terms=max_terms, eval_size=1, eval_seed=0)
    return [p.prompt for p in task.train_problems(groups, seed=0, step=1) for _ in range(size)]


@pytest.fixture(scope="module")
def base_dir():
    """The default task's model: the built-in base (model=tiny, SFT'd on sums; built once and cached)."""
    from rlx_cli.engine.base_model import ensure_base_model
    from rlx_cli.loops.build import build_task
    from rlx_cli.loops.progress import Progress

    cfg = compose([])
    return ensure_base_model(cfg.model, cfg.task, build_task(cfg.task), Progress(quiet=True))


def default_model(base_dir):
    return LlamaForCausalLM.from_pretrained(base_dir).eval()


def small_model(_):
    """model=small's arch, random, its head's EOS row scaled by 1.2: answers of 3 to 64 tokens, as shortcut_sums'
    base writes direct and worked answers."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(char_llama_config(SMALL, tie=False, max_positions=256)).eval()
    with torch.no_grad():
        model.lm_head.weight[TOKENIZER.eos_token_id] *= 1.2
    return model


def long_model(_):
    """model=small's arch, random: no EOS, every answer runs the whole budget."""
    torch.manual_seed(0)
    return LlamaForCausalLM(char_llama_config(SMALL, max_positions=256)).eval()


def qwen2_model(_):
    """A random Qwen2: grouped-query attention (4 heads, 2 key-value heads) and biased projections."""
    torch.manual_seed(0)
    tok = TOKENIZER
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    arch = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, head_dim=16)
    config = Qwen2Config(vocab_size=20, num_key_value_heads=2, max_position_embeddings=256, **arch, **special)
    return Qwen2ForCausalLM(config).eval()


def lora_policy(base_dir):
    """The policy rlx builds with model.finetune=lora on the default base, its adapters moved off zero."""
    cfg = compose(["model.finetune=lora"])
    policy = build_models(base_dir, cfg.model, needs_critic=False, critic_cfg=cfg.critic).policy
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    return policy.eval()


# (model, prompts' terms, max_new_tokens): the default task; long_sums' prompts with a longer budget than any
# answer; shortcut_sums' prompts and budget with answers of every length; a Qwen2; a LoRA-wrapped policy
GREEDY = {
    "sums": (default_model, (2, 6), 48),
    "long_sums": (long_model, (3, 8), 160),
    "shortcut_sums": (small_model, (3, 8), 64),
    "qwen2": (qwen2_model, (2, 6), 48),
    "lora": (lora_policy, (2, 6), 48),
}


@pytest.mark.parametrize("case", list(GREEDY))
def test_greedy_answers_are_generates_token_for_token(case, base_dir):
    make, terms, budget = GREEDY[case]
    model, texts = make(base_dir), prompts(*terms)
    expected = HFSampler(TOKENIZER).generate(model, texts, temperature=0, max_new_tokens=budget)
    got = FastSampler(TOKENIZER).generate(model, texts, temperature=0, max_new_tokens=budget)
    assert torch.equal(got.input_ids, expected.input_ids)
    assert torch.equal(got.attention_mask, expected.attention_mask) and got.texts == expected.texts
    assert got.sampler_logp is None  # greedy: no distribution was drawn from


def test_continuations_and_chunks_cutting_through_groups_are_generates(base_dir):
    """SPO's continuations (prompt + the start of an answer) at rows=5: chunks that split runs of one prompt."""
    model, texts = lora_policy(base_dir), prompts(2, 6, groups=4, size=3)
    starts = HFSampler(TOKENIZER).generate(model, texts, temperature=0, max_new_tokens=12).responses.tolist()
    prefixes = [row[: 1 + i % 4] for i, row in enumerate(starts)]
    expected = HFSampler(TOKENIZER).generate(model, texts, temperature=0, max_new_tokens=30, prefixes=prefixes)
    got = FastSampler(TOKENIZER, rows=5).generate(model, texts, temperature=0, max_new_tokens=30, prefixes=prefixes)
    assert torch.equal(got.input_ids, expected.input_ids) and got.texts == expected.texts


def teacher_forced_logits(model, batch, temperature: float) -> torch.Tensor:
    """The response positions' logits of one forward over the whole answers, divided by ``temperature`` [B, T, V]."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    return logits.logits[:, batch.prompt_len - 1 : -1].float() / temperature


def summation_order_bound(logits: torch.Tensor, reduction: int) -> torch.Tensor:
    """How far apart fp32 may put two computations of one log-softmax entry that differ only in their summation
    order, per position of ``logits`` [..., V] (divided by the temperature) -> [...]: a sum of K = ``reduction``
    fp32 terms (the head's, K the hidden size) rounds to about eps·√K of its size (rounding errors add as a random
    walk), a log-prob z_t − logsumexp(z) holds two such sums, and each of the two computations rounds its own:
    4·eps·√K·max|z|. (1e-5 was one CPU's: an AMD EPYC put 3 of 1,444 LoRA tokens 1.29e-5 apart, under this bound's
    3.1e-5 to 7.6e-5 there.)"""
    return 4 * torch.finfo(torch.float32).eps * math.sqrt(reduction) * logits.abs().amax(-1)


@pytest.mark.parametrize("case", ["sums", "qwen2", "lora"])
def test_sampled_logp_are_a_teacher_forced_forwards(case, base_dir):
    """At temperature 0.7 (no truncation) each token's returned log-prob is the trainer's temperature-scaled
    log-softmax of the same answer, to fp32's rounding of the two summation orders (``summation_order_bound``)."""
    make, terms, budget = GREEDY[case]
    model = make(base_dir)
    torch.manual_seed(0)
    batch = FastSampler(TOKENIZER).generate(model, prompts(*terms), temperature=0.7, max_new_tokens=budget)
    expected, _ = response_logp(model, batch, 0.7)
    real = batch.response_mask.bool()
    assert batch.sampler_logp.dtype == torch.float32 and not batch.sampler_logp[~real].any()
    bound = summation_order_bound(teacher_forced_logits(model, batch, 0.7), model.config.hidden_size)
    assert ((batch.sampler_logp - expected).abs() <= bound)[real].all()


def test_truncated_logp_are_generates_warpers_on_a_teacher_forced_forward(base_dir):
    """With top-k 5 and top-p 0.8 the returned log-probs are the log-softmax of transformers' warpers' output on a
    teacher-forced forward's logits / temperature, to fp32's rounding of the two summation orders; no sampled token
    lies outside what they keep."""
    model, temperature = qwen2_model(base_dir), 1.3
    torch.manual_seed(0)
    sampler = FastSampler(TOKENIZER, top_p=0.8, top_k=5)
    batch = sampler.generate(model, prompts(2, 6), temperature=temperature, max_new_tokens=24)
    logits = teacher_forced_logits(model, batch, temperature)
    kept = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(5)(None, logits.flatten(0, 1)))
    expected = kept.log_softmax(-1).gather(1, batch.responses.reshape(-1, 1)).view_as(batch.responses)
    real = batch.response_mask.bool()
    assert torch.isfinite(expected[real]).all()
    bound = summation_order_bound(logits, model.config.hidden_size)
    assert ((batch.sampler_logp - expected).abs() <= bound)[real].all()


def test_first_tokens_are_drawn_as_rollout_hf_draws_them():
    """20,000 first tokens from each sampler (a random Llama: a spread distribution; top-p 0.9), independent draws:
    a chi-square test of homogeneity does not tell them apart (rlx inverts the cumulative distribution at one uniform
    number a row, generate draws with torch.multinomial)."""
    from scipy.stats import chi2_contingency

    torch.manual_seed(0)
    model = LlamaForCausalLM(char_llama_config(SMALL)).eval()
    hf, fast = HFSampler(TOKENIZER, top_p=0.9), FastSampler(TOKENIZER, top_p=0.9)

    def first_tokens(sampler, seed: int, n: int = 20_000) -> torch.Tensor:
        torch.manual_seed(seed)
        return sampler.generate(model, ["12,7,30:"] * n, temperature=1.0, max_new_tokens=1).responses[:, 0]

    table = torch.stack(
        [torch.bincount(first_tokens(s, seed), minlength=len(TOKENIZER)) for s, seed in ((hf, 1), (fast, 2))]
    )
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 5  # a spread distribution: the test has power
    p = chi2_contingency(table.numpy()).pvalue
    assert p > 0.01, p


def test_runs_are_identical_consecutive_rows():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    first, run = runs(ids, mask)
    assert first.tolist() == [0, 2, 3, 4] and run.tolist() == [0, 0, 1, 2, 3, 3]


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (3, 1.0), (0, 0.5), (4, 0.7), (50, 0.95)])
def test_truncation_is_generates_warpers(top_k, top_p):
    torch.manual_seed(0)
    scores = torch.randn(64, 20) * 2
    expected = scores
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(truncated(scores, top_k, top_p), expected)


def test_an_architecture_it_does_not_compute_is_refused_with_the_way_out():
    from transformers import GPT2Config, GPT2LMHeadModel

    check_architecture(qwen2_model(None))
    with pytest.raises(UserError, match="rollout=fast computes llama and qwen2.*not gpt2.*rollout=hf"):
        check_architecture(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=20)))
    arch = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    windowed = Qwen2Config(vocab_size=20, **arch, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    with pytest.raises(UserError, match="qwen2 with sliding-window attention"):
        check_architecture(Qwen2ForCausalLM(windowed))


def test_a_rows_sampled_answer_does_not_depend_on_when_the_other_rows_stop(base_dir):
    """Common random numbers: a prompt's answer is the same whatever the rows before it (and so whenever they stop),
    from the same generator state; with draws over the live rows only, a row that stops early shifts the others'."""
    model, sampler = default_model(base_dir), FastSampler(TOKENIZER)
    answers = []
    for first in ("3,4:", "5,1,2,3,4:", "2,2,9:", "8,0,9,9,9,9:"):
        torch.manual_seed(11)
        answers.append(sampler.generate(model, [first, "7,8,9,9,5,6,4,3:"], temperature=1.0, max_new_tokens=48))
    stops = [int(a.response_mask[0].sum()) for a in answers]
    assert len(set(stops)) == 4 and max(stops) < int(answers[0].response_mask[1].sum())  # the first stops first
    assert len({a.texts[1] for a in answers}) == 1
