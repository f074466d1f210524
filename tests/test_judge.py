"""The generative verifier on a tiny judge built from config: its reward is the softmax over its two words' logits."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny_llama
from omegaconf import OmegaConf

from rlx_cli.config.errors import UserError
from rlx_cli.sampling.judge import Judge, JudgedTask, judge_reward
from rlx_cli.sampling.tasks import Problem, SumsTask

JUDGE = {
    "template": "{question}{response}={reference}:",
    "yes": "1",
    "no": "0",
    "hard": False,
    "final_step": False,
    "step_separator": ",",
    "chat_template": False,
    "rows": 2,
}
QUESTIONS = ["3,4:", "5,9,2:", "1,1:"]
REFERENCES = ["7", "16", "2"]
RESPONSES = ["3+4=7#7", "5+9=14,14+2=16#16", "1+1=3#3"]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("judge") / "judge", layers=1, heads=2, head_dim=16)


def load(judge_dir, **changes) -> Judge:
    return Judge.load(
        OmegaConf.create({**JUDGE, "path": str(judge_dir), **changes}), torch.device("cpu"), torch.float32
    )


def by_hand(judge: Judge, text: str) -> torch.Tensor:
    """The judge's next-token logits after ``text``, one unpadded row."""
    ids = judge.tokenizer(text)["input_ids"]
    return judge.model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_soft_reward_is_the_softmax_over_yes_and_no_of_one_batched_forward(judge_dir):
    judge = load(judge_dir)  # rows=2: two forwards of 2 and 1 rows, left-padded
    rewards, errors = judge.score(QUESTIONS, REFERENCES, RESPONSES)
    yes, no = judge.tokenizer.convert_tokens_to_ids(["1", "0"])
    assert (judge.yes, judge.no) == (yes, no)
    with torch.no_grad():
        for reward, q, a, r in zip(rewards, QUESTIONS, REFERENCES, RESPONSES):
            logits = by_hand(judge, f"{q}{r}={a}:")
            manual = torch.exp(logits[yes]) / (torch.exp(logits[yes]) + torch.exp(logits[no]))
            assert reward == pytest.approx(manual.item(), abs=1e-5)
    assert errors == 0 and len(set(rewards)) == 3


def test_hard_reward_is_whether_yes_is_the_top_token(judge_dir):
    judge = load(judge_dir, hard=True)
    rewards, _ = judge.score(QUESTIONS, REFERENCES, RESPONSES)
    with torch.no_grad():
        expected = [
            float(by_hand(judge, f"{q}{r}={a}:").argmax() == judge.yes)
            for q, a, r in zip(QUESTIONS, REFERENCES, RESPONSES)
        ]
    assert rewards == expected
    logits = torch.tensor([[0.0, 2.0, 1.0], [0.0, 1.0, 3.0], [9.0, 1.0, 0.5]])  # yes = 1, no = 2
    assert judge_reward(logits, 1, 2, hard=True).tolist() == [1.0, 0.0, 0.0]  # row 3: the top token is neither
    assert judge_reward(logits, 1, 2).tolist() == pytest.approx([1 / (1 + torch.e**-1), 1 / (1 + torch.e**2), 0.622459])


def test_final_step_only_shows_the_text_after_the_last_separator(judge_dir):
    judge = load(judge_dir, final_step=True)
    assert judge.prompt("5,9,2:", "16", "5+9=14,14+2=16#16") == judge.tokenizer("5,9,2:14+2=16#16=16:")["input_ids"]


def test_an_answer_the_judge_cannot_read_scores_0_and_is_counted(judge_dir):
    task = JudgedTask(SumsTask(min_terms=2, max_terms=3, eval_size=4, eval_seed=0, verifier="judge"), load(judge_dir))
    problems = [Problem("3,4:", "7"), Problem("3,4:", "7")]
    rewards = task.score_batch(["3+4=7#7", "7" * 80], problems)  # the second is longer than the judge's 64 positions
    assert rewards[0] > 0 and rewards[1] == 0.0 and task.reward_errors == 1
    assert task.eval_problems and task.min_terms == 2  # everything else is the task's
    task.judge.forward = lambda rows: torch.full((len(rows),), float("nan"))  # non-finite logits
    assert task.score_batch(["3+4=7#7"], problems[:1]) == [0.0] and task.reward_errors == 2


def test_words_must_be_single_known_tokens_and_the_template_must_fit(judge_dir):
    with pytest.raises(UserError, match=r"task.judge.yes='YES' is 3 tokens for the judge's tokenizer"):
        load(judge_dir, yes="YES")
    with pytest.raises(UserError, match=r"task.judge.no='N' is not in the judge's vocabulary"):
        load(judge_dir, no="N")
    with pytest.raises(UserError, match="task.judge.yes='1' and task.judge.no='1' are the same token"):
        load(judge_dir, no=1)  # an int from the command line counts as its text
    with pytest.raises(UserError, match=r"task.judge.template=.*'answer'.*valid fields: question, reference, response"):
        load(judge_dir, template="{question}{answer}")
