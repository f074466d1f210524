"""Credit below the answer, by hand: step parsing and its token mapping, grpo_process, SPO-chain's cutpoints and
segment advantages, the no-policy-gradient loss, the low-probability token filter (arithmetic in the comments)."""

from __future__ import annotations

import random

import pytest
import torch

from components import advantage, policy_loss, token_filter
from rlx_cli.engine.batch import Rollout
from rlx_cli.sampling.credit import step_metrics, step_tensors, token_char_ends
from rlx_cli.sampling.rollout import HFSampler, assemble
from rlx_cli.sampling.tasks import Problem, sum_steps

S = 3**-0.5  # 1 / std of [1, 0, 1] (unbiased: var = (1/9 + 4/9 + 1/9) / 2 = 1/3)


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol)


# ---------------------------------------------------------------- steps of a sums answer


def test_sum_steps_check_each_step_against_the_responses_own_previous_total():
    problem = Problem("3,4,5,9:", "21")
    assert sum_steps("3+4=7,7+5=12,12+9=21#21", problem) == [(5, 1.0), (12, 1.0), (20, 1.0), (23, 1.0)]
    # 7+5=2 drops the carry (wrong); 2+9=11 is right from the response's own total 2; the answer 11 is not 21
    assert sum_steps("3+4=7,7+5=2,2+9=11#11", problem) == [(5, 1.0), (11, 0.0), (18, 1.0), (21, 0.0)]
    # a step that does not parse is wrong and leaves the next step's a unchecked; a wrong term b is wrong
    assert sum_steps("3+4=7,7+x=12,12+9=21", problem) == [(5, 1.0), (12, 0.0), (20, 1.0)]
    assert sum_steps("3+5=8#8", problem) == [(5, 0.0), (7, 0.0)]
    assert sum_steps("", problem) == [] and sum_steps("3+4=7#", problem) == [(5, 1.0), (6, 0.0)]


# ---------------------------------------------------------------- steps -> tokens


@pytest.fixture(scope="module")
def chunky_tokenizer():
    """The character tokenizer, except that a digit followed by a comma is one token ("7,")."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<pad>", "<s>", "</s>", *"0123456789+=,#:", *(f"{d}," for d in "0123456789")]
    core = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d,|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def rollout_of(tokenizer, texts: list[str]) -> Rollout:
    """Responses ``texts`` + EOS after a one-token prompt, as the sampler assembles them."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, rows))
    responses = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    enc = {"input_ids": torch.ones(len(rows), 1, dtype=torch.long), "attention_mask": torch.ones(len(rows), 1)}
    return assemble(tokenizer, enc, responses)


def test_steps_map_to_the_token_holding_their_last_character_mid_token_too(chunky_tokenizer):
    text = "3+4=7,7+5=12#12"
    batch = rollout_of(chunky_tokenizer, [text, "3+4=7,"])
    # tokens of row 0: 3 + 4 = "7," 7 + 5 = 1 2 # 1 2 </s> -> text lengths after each token:
    assert token_char_ends(chunky_tokenizer, [batch.responses[0, :15].tolist()], [text]) == [
        [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 15]
    ]
    steps = [[(5, 1.0), (12, 0.0), (15, 1.0)], [(5, 0.5), (6, 0.25), (99, 1.0), (0, 1.0)]]
    out = step_tensors(steps, batch, chunky_tokenizer)
    # row 0: step 1 ends at "7" (character 4), inside the token "7," (token 4); step 2 at the "2" of "12" (token 10);
    # the answer at the last "2" (token 13); the EOS (token 14) is after the last step.
    # row 1 ("3+4=7,"): both steps end in the token "7,": it keeps the lower reward; ends 99 and 0 are dropped
    ends = torch.zeros(2, 15)
    ends[0, [4, 10, 13]] = 1
    ends[1, 4] = 1
    rewards = torch.zeros(2, 15)
    rewards[0, [4, 13]] = 1.0
    rewards[1, 4] = 0.25
    assert torch.equal(out["step_ends"], ends) and torch.equal(out["step_rewards"], rewards)
    batch.annotations.update(out)
    assert step_metrics(batch) == pytest.approx({"train/steps_per_answer": 2.0, "train/step_accuracy": 2.25 / 4})


def test_token_char_ends_decodes_prefixes_when_single_tokens_do_not_join(chunky_tokenizer):
    class Spaced:  # a tokenizer whose tokens decode with a leading space alone, as SentencePiece's do
        def batch_decode(self, rows, skip_special_tokens=True):
            return [" ".join(chunky_tokenizer.decode(r) for r in row) if len(row) > 1 else " x" for row in rows]

    # "1 2 3": single tokens give " x" each (6 characters, not the text): every prefix is decoded instead
    assert token_char_ends(Spaced(), [[8, 9, 10]], ["1 2 3"]) == [[2, 3, 5]]


# ---------------------------------------------------------------- grpo_process


def test_grpo_process_normalises_over_the_groups_steps_and_sums_the_steps_at_or_after_each_token():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0.0]])
    ends = torch.zeros(3, 5, dtype=torch.bool)
    ends[0, [1, 3, 4]] = True  # the end at the padded token 4 does not count
    ends[1, 2] = True
    ends[2, [0, 2]] = True
    rewards = torch.zeros(3, 5)
    rewards[0, [1, 3, 4]] = torch.tensor([1.0, 0.0, 100.0])
    rewards[1, 2] = 1.0
    rewards[2, [0, 2]] = torch.tensor([0.5, 1.5])
    groups = torch.tensor([0, 0, 1])
    adv = advantage.grpo_process(rewards, ends, groups, mask, eps=0.0)
    # group 0 (rows 0, 1) has unequal step counts, 2 and 1: rewards [1, 0, 1], mean 2/3, std 1/√3 ->
    # r̃ = +1/√3, −2/√3, +1/√3. Row 0: tokens 0–1 see both steps (1/√3 − 2/√3), tokens 2–3 the second one.
    # Row 1: tokens 0–2 see its one step; tokens 3–4 come after its last step: 0.
    # group 1 (row 2): [0.5, 1.5], mean 1, std √0.5 -> ∓1/√2: token 0 both (0), tokens 1–2 the second
    expected = [
        [-S, -S, -2 * S, -2 * S, 0],
        [S, S, S, 0, 0],
        [0, 2**-0.5, 2**-0.5, 0, 0],
    ]
    assert close(adv, expected)
    # the mix: half process, half outcome GRPO (scores [1, 0, 1]: group 0 ±1/√2, group 1 a singleton: its score)
    mixed = advantage.grpo_process(rewards, ends, groups, mask, torch.tensor([1.0, 0.0, 1.0]), outcome_weight=0.5)
    h = 0.5 * 2**-0.5
    assert close(mixed[1], [0.5 * S - h, 0.5 * S - h, 0.5 * S - h, -h, -h])
    assert close(mixed[2], [0.5, 0.5 + h, 0.5 + h, 0, 0])


def test_grpo_process_edge_cases():
    mask = torch.ones(2, 3)
    ends = torch.tensor([[False, True, False], [False, False, False]])
    rewards = torch.tensor([[0.0, 0.3, 0.0], [0.0, 0.0, 0.0]])
    # the group's only step keeps its raw reward (as grpo's singleton groups); a row without steps gets 0
    assert close(advantage.grpo_process(rewards, ends, torch.tensor([0, 0]), mask), [[0.3, 0.3, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="outcome_weight"):
        advantage.grpo_process(rewards, ends, torch.tensor([0, 0]), mask, outcome_weight=0.5)


# ---------------------------------------------------------------- SPO-chain


def test_spo_cutpoints_every_kth_low_probability_token_the_first_included():
    probs = torch.tensor([[0.95, 0.5, 0.95, 0.3, 0.2, 0.1, 0.8, 0.4, 0.6, 0.5]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0.0]])  # the last token is padding
    # low (p < 0.9): tokens 1, 3, 4, 5, 6, 7, 8 -> the 1st, 3rd, 5th, 7th with interval 2; the 1st and 6th with 5
    assert advantage.spo_cutpoints(probs, mask, interval=2).nonzero()[:, 1].tolist() == [1, 4, 6, 8]
    assert advantage.spo_cutpoints(probs, mask, interval=5).nonzero()[:, 1].tolist() == [1, 7]
    assert not advantage.spo_cutpoints(torch.full((1, 4), 0.95), torch.ones(1, 4)).any()


def test_spo_chain_segment_advantages_by_hand():
    probs = torch.tensor(
        [
            [0.5, 0.95, 0.6, 0.4, 0.99, 0.7],  # a cutpoint before token 0 (c = -1, the prompt alone) and token 3
            [0.95, 0.8, 0.5, 0.9, 0.3, 0.2],  # cutpoints before tokens 2 and 4, none at -1
            [0.95, 0.95, 0.99, 0.95, 0.95, 0.95],  # no low-probability token: no cutpoint
            [0.5, 0.6, 0.95, 0.5, 0.5, 0.5],  # a cutpoint before token 1; tokens 4-5 are padding
        ]
    )
    mask = torch.tensor([[1.0] * 6, [1.0] * 6, [1.0] * 6, [1, 1, 1, 1, 0, 0]])
    cuts = torch.zeros(4, 6)
    values = torch.zeros(4, 6)
    cuts[0, [0, 3]], values[0, [0, 3]] = 1, torch.tensor([0.4, 0.7])
    cuts[1, [2, 4]], values[1, [2, 4]] = 1, torch.tensor([0.5, 0.25])
    cuts[3, 1], values[3, 1] = 1, 0.6
    scores = torch.tensor([0.0, 1.0, 1.0, 1.0])
    adv = advantage.spo_chain(values, cuts, probs, scores, mask, whiten_low_prob=False)
    # row 0: tokens 0-2 V(3) − V(-1) = 0.7 − 0.4; tokens 3-5 R − V(3) = 0 − 0.7; p > 0.9 at tokens 1 and 4 -> 0
    # row 1: tokens 0-1 precede the first cutpoint (c_0 = 1): 0; tokens 2-3 V(4) − V(2) = −0.25 (p = 0.9 keeps
    #        its advantage); tokens 4-5 R − V(4) = 0.75
    # row 2: all zeros; row 3: token 0 before the cutpoint, tokens 1-3 R − V(1) = 0.4, token 2 has p 0.95
    expected = [
        [0.3, 0, 0.3, -0.7, 0, -0.7],
        [0, 0, -0.25, -0.25, 0.75, 0.75],
        [0, 0, 0, 0, 0, 0],
        [0, 0.4, 0, 0.4, 0, 0],
    ]
    assert close(adv, expected)
    whitened = advantage.spo_chain(values, cuts, probs, scores, mask)
    kept = (mask > 0) & (probs <= 0.9)
    assert close(whitened[~kept], torch.zeros(int((~kept).sum())))  # only the kept tokens carry an advantage
    assert close(whitened[kept].mean(), 0.0) and close(whitened[kept].std(), 1.0, tol=1e-4)  # unbiased, as verl


def reference_spo(cutpoints: list[int], cut_values: list[float], score: float, probs: list[float]) -> list[float]:
    """AIFrameResearch/SPO ``_compute_token_advantages`` (chain), transcribed: cutpoints c (state after token c)."""
    n = len(probs)
    if not cutpoints:
        return [0.0] * n
    token_values, advantages, base = [None] * n, [None] * n, None
    token_values[-1] = score
    if cutpoints[0] == -1:
        base, cutpoints, cut_values = cut_values[0], cutpoints[1:], cut_values[1:]
    for idx, value in zip(cutpoints, cut_values):
        token_values[idx] = value
    for i in range(n):
        if token_values[i] is not None:
            advantages[i] = 0 if base is None else token_values[i] - base
            base = token_values[i]
    for i in range(n - 1, -1, -1):
        if advantages[i] is None:
            advantages[i] = advantages[i + 1]
    return [0.0 if p > 0.9 else a for a, p in zip(advantages, probs)]


def test_spo_chain_matches_the_reference_loop_on_random_rows():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        probs = [rng.choice([0.95, 0.99, 0.9, 0.5, 0.2]) for _ in range(n)]
        interval = rng.randint(1, 3)
        p = torch.tensor([probs])
        cuts = advantage.spo_cutpoints(p, torch.ones(1, n), interval=interval)[0]
        values = torch.tensor([[round(rng.random(), 2) for _ in range(n)]])
        score = float(rng.random() < 0.5)
        got = advantage.spo_chain(values, cuts[None], p, torch.tensor([score]), torch.ones(1, n), whiten_low_prob=False)
        starts = cuts.nonzero().squeeze(1).tolist()
        want = reference_spo([t - 1 for t in starts], [values[0, t].item() for t in starts], score, probs)
        assert close(got[0], want), (probs, interval, starts)


# ---------------------------------------------------------------- online RFT's and SPO's loss pieces


def test_no_policy_gradient_is_a_zero_on_the_graph():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, metrics = policy_loss.none(logp, logp.detach(), torch.ones(1, 2), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == 0.0 and metrics == {} and torch.equal(logp.grad, torch.zeros(1, 2))


def test_low_probability_filter_keeps_real_tokens_sampled_below_the_threshold():
    old_logp = torch.tensor([[0.95, 0.5, 0.9, 0.1]]).log()
    assert token_filter.low_probability(old_logp, torch.tensor([[1, 1, 1, 0.0]])).tolist() == [
        [False, True, False, False]  # 0.9 is not below 0.9; the last token is padding
    ]


# ---------------------------------------------------------------- the rollout side


def test_annotations_follow_select_and_concat():
    from rlx_cli.engine.base_model import char_tokenizer

    tokenizer = char_tokenizer()
    a, b = rollout_of(tokenizer, ["1+2=3#3"]), rollout_of(tokenizer, ["1#1", "22"])
    a.annotations["cuts"] = torch.ones_like(a.response_mask)
    b.annotations["cuts"] = 2 * b.response_mask
    both = Rollout.concat([a, b], tokenizer.pad_token_id)
    # "1+2=3#3</s>" 8 tokens, "1#1</s>" 4, "22</s>" 3: b's rows padded to 8 with 0
    assert both.annotations["cuts"].tolist() == [[1.0] * 8, [2, 2, 2, 2, 0, 0, 0, 0], [2, 2, 2, 0, 0, 0, 0, 0]]
    assert both.select(torch.tensor([2])).annotations["cuts"].tolist() == [[2, 2, 2, 0, 0, 0, 0, 0]]


def test_prefixes_follow_their_prompts_tokens():
    from rlx_cli.engine.base_model import char_tokenizer

    tokenizer = char_tokenizer()
    sampler = HFSampler(tokenizer)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    enc = sampler.encode(["3,4:", "12,3:"], [ids("3+4"), []])
    # "<s>3,4:" + "3+4" (8 tokens) and "<s>12,3:" (6 tokens, left-padded by 2)
    assert enc["input_ids"].tolist() == [[1, *ids("3,4:3+4")], [0, 0, 1, *ids("12,3:")]]
    assert enc["attention_mask"].tolist() == [[1] * 8, [0, 0, 1, 1, 1, 1, 1, 1]]


def test_step_verifier_returns_that_are_not_steps_count_as_errors():
    from rlx_cli.sampling.verifiers import score_steps_all

    def verifier(response, answer, prompt):
        return {"ok": [(2, 1), (4, 0.5)], "bad end": [("2", 1.0)], "not pairs": [3]}[response]

    steps, errors = score_steps_all(verifier, [("ok", "", ""), ("bad end", "", ""), ("not pairs", "", "")], 5.0)
    assert steps == [[(2, 1.0), (4, 0.5)], [], []] and errors == 2


def test_a_step_verifier_that_cannot_be_imported_is_one_line_naming_the_key(tmp_path):
    from rlx_cli.config.errors import UserError
    from rlx_cli.sampling.tasks import FileTask

    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1,2:", "answer": "3"}\n' * 4)
    settings = dict(path=data, eval_path=None, eval_fraction=0.25, prompt_field="prompt", answer_field="answer")
    settings.update(template="{prompt}", verifier="exact", answer_pattern=None, verifier_timeout=1.0)
    with pytest.raises(UserError, match=r"task.step_verifier=no_such_module:steps cannot be imported"):
        FileTask(**settings, step_verifier="no_such_module:steps")
    with pytest.raises(UserError, match=r"task.step_verifier=steps is not valid \(valid: module:function\)"):
        FileTask(**settings, step_verifier="steps")
    assert not FileTask(**settings).scores_steps


def test_a_resumed_rft_run_needs_its_answers_drawn_for_the_same_settings(tmp_path):
    from omegaconf import OmegaConf

    from rlx_cli.config.errors import UserError
    from rlx_cli.engine.base_model import char_tokenizer
    from rlx_cli.loops.rft import load_samples, save_samples

    def cfg(steps: int):
        return OmegaConf.create(
            {
                "seed": 0,
                "trainer": {"steps": steps, "output_dir": str(tmp_path)},
                "rollout": {"prompts_per_step": 4, "group_size": 2},
            }
        )

    with pytest.raises(UserError, match="rft_samples is missing"):
        load_samples(cfg(4))
    answers = rollout_of(char_tokenizer(), ["1+2=3#3", "4#4"])
    save_samples(cfg(4), answers)
    back = load_samples(cfg(4))
    assert torch.equal(back.input_ids, answers.input_ids) and back.texts == answers.texts
    with pytest.raises(UserError, match=r"trainer.steps=8 does not fit .* drawn for trainer.steps=4 \(valid: 4\)"):
        load_samples(cfg(8))
