import random

import pytest
import torch

from rlx_cli.config.errors import UserError
from rlx_cli.sampling.tasks import Problem, SumsTask, worked


def test_worked_solution_without_defect():
    # 3+4=7 (no crossing), 7+5=12 (crosses 10), 12+9=21 (crosses 20)
    assert worked([3, 4, 5, 9], 0.0, random.Random(0)) == "3+4=7,7+5=12,12+9=21#21"


def test_worked_solution_always_dropping_the_carry():
    # 7+5=12 loses its carry -> 2; then 2+9=11 crosses 10 -> 1; later steps continue from the wrong number
    assert worked([3, 4, 5, 9], 1.0, random.Random(0)) == "3+4=7,7+5=2,2+9=1#1"


def test_score_reads_the_text_after_the_last_hash():
    problem = Problem("3,4,5,9:", "21")
    assert SumsTask.score("3+4=7,7+5=12,12+9=21#21", problem) == 1.0
    assert SumsTask.score("3+4=7#7#21", problem) == 1.0
    assert SumsTask.score("3+4=7,7+5=2,2+9=11#11", problem) == 0.0
    assert SumsTask.score("21", problem) == 0.0  # no answer marker
    assert SumsTask.score("", problem) == 0.0


def test_train_problems_depend_only_on_seed_and_step():
    task = SumsTask(min_terms=2, max_terms=6, eval_size=5, eval_seed=1)
    assert task.train_problems(8, seed=0, step=3) == task.train_problems(8, seed=0, step=3)
    assert task.train_problems(8, seed=0, step=3) != task.train_problems(8, seed=0, step=4)
    assert task.train_problems(8, seed=0, step=3) != task.train_problems(8, seed=1, step=3)
    lengths = {len(p.prompt.split(",")) for p in task.train_problems(200, seed=0, step=1)}
    assert lengths == {2, 3, 4, 5, 6}


def test_bad_term_range_is_a_user_error():
    with pytest.raises(UserError, match="task.min_terms"):
        SumsTask(min_terms=5, max_terms=3, eval_size=1, eval_seed=0)


def test_long_sums_brings_its_model_and_response_budget():
    from rlx_cli.config.compose import compose
    from rlx_cli.loops.build import build_task

    cfg = compose(["task=long_sums", "algo=vapo"])
    assert (cfg.model.name, cfg.model.arch.hidden_size, cfg.model.sft.carry_drop) == ("small", 96, 0.3)
    assert cfg.rollout.max_new_tokens == 64
    longest = "".join(worked(list(range(9, 1, -1)), 0.0, random.Random(0)))  # 8 terms, two-digit sums
    assert len(longest) + 1 <= cfg.rollout.max_new_tokens  # + EOS
    assert {len(p.prompt.split(",")) for p in build_task(cfg.task).eval_problems} == set(range(3, 9))
    # explicit choices still win over the task's
    assert compose(["task=long_sums", "model=tiny"]).model.name == "tiny"
    assert compose(["task=long_sums", "rollout.max_new_tokens=80"]).rollout.max_new_tokens == 80


def test_a_fixed_pool_is_drawn_once_per_seed_and_each_step_takes_distinct_problems_from_it():
    from rlx_cli.sampling.tasks import SumsTask

    task = SumsTask(min_terms=3, max_terms=8, eval_size=4, eval_seed=1, pool=20)
    seen = set()
    for step in range(30):
        drawn = task.train_problems(8, seed=0, step=step)
        assert len(set(drawn)) == 8  # distinct within a step
        seen.update(drawn)
    assert len(seen) == 20  # 240 draws, all from the pool of 20
    assert task.train_problems(8, seed=0, step=3) == task.train_problems(8, seed=0, step=3)  # resumable
    other_seed = {p for step in range(30) for p in task.train_problems(8, seed=1, step=step)}
    assert len(other_seed) == 20 and other_seed != seen
    fresh = SumsTask(min_terms=3, max_terms=8, eval_size=4, eval_seed=1)
    assert len({p for step in range(30) for p in fresh.train_problems(8, seed=0, step=step)}) > 150


def test_a_draw_larger_than_the_pool_is_refused_in_one_line_naming_it():
    """DPO's pairs draw ``preference.pool_prompts`` problems at once, past the step's draw that validate checks."""
    task = SumsTask(min_terms=3, max_terms=8, eval_size=4, eval_seed=1, pool=20)
    assert len(set(task.train_problems(20, seed=0, step=0))) == 20  # the whole pool
    with pytest.raises(
        UserError, match=r"^task\.pool=20 is smaller than the 21 problems this draw takes \(valid: 21 or up\)$"
    ):
        task.train_problems(21, seed=0, step=0)


@pytest.mark.parametrize("algo", ["grpo", "vapo"])
def test_varied_sums_brings_its_base_and_budget_and_validates(algo):
    from rlx_cli.config.compose import compose
    from rlx_cli.config.validate import validate
    from rlx_cli.loops.build import build_task

    cfg = compose(["task=varied_sums", f"algo={algo}"])
    validate(cfg)
    assert (cfg.model.name, cfg.model.arch.hidden_size, cfg.model.sft.carry_drop) == ("varied_sums", 96, 0.7)
    longest = worked([9] * 20, 0.0, random.Random(0))  # 20 terms of 9: the longest answer
    assert len(longest) == 171 and len(longest) + 1 <= cfg.rollout.max_new_tokens  # + EOS
    assert 1 + len("9," * 20) + cfg.rollout.max_new_tokens <= cfg.model.arch.max_position_embeddings  # BOS, prompt
    assert {len(p.prompt.split(",")) for p in build_task(cfg.task).eval_problems} == set(range(2, 21))


def test_length_buckets_give_the_whole_batchs_gradient():
    """model.sft.length_buckets: micro-batches of similar length, each weighted by its share of the response tokens,
    backpropagate the one-batch token mean (7 + 1, 23 + 1, 13 + 1 and 2 + 1 response tokens here)."""
    from transformers import LlamaForCausalLM

    from rlx_cli.engine.base_model import char_llama_config, char_tokenizer, response_tokens, sft_backward

    examples = [("3,4:", "3+4=7#7"), ("3,4,5,9:", "3+4=7,7+5=12,12+9=21#21"), ("1,2,3:", "1+2=3,3+3=6#6"), ("5:", "#5")]
    assert response_tokens(char_tokenizer(), examples) == 8 + 24 + 14 + 3
    arch = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1, head_dim=32)
    grads, losses = [], []
    for buckets in (1, 3):
        torch.manual_seed(0)
        model = LlamaForCausalLM(char_llama_config(arch, max_positions=64))
        losses.append(sft_backward(model, char_tokenizer(), examples, buckets))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and grads[0].abs().sum() > 0
