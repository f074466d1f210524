"""The two sides of benchmarks/vs_trl.py: the saved model both tools load, and one timed run of each (a worker
process: ``vs_trl.py --worker rlx|trl``). See vs_trl.py for what is measured and how.

``--task user`` is a user's task: ``model=hf task=jsonl`` on a prompt file (``_common.write_user_rows``) for rlx,
the same file's rows, drawn as rlx draws them, for TRL, whose reward is the stripped completion's exact match."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Timers, load, one_thread, peak_rss_mib  # noqa: E402

SIZES = {  # LlamaConfig fields besides the tokenizer's; None = the built-in base model of that name (SFT'd, cached)
    "tiny": None,
    "small": None,  # task=long_sums's base
    "user": None,  # a user's model: benchmarks/scaling.py's 10.6M Qwen2 (vocabulary 32,000), random weights
    "medium": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
    ),
    "large": dict(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=64,
    ),
    "1.5b": dict(  # Qwen2.5-1.5B's shape (a GPU's size), without its 151,936-token vocabulary
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
    ),
}
NEW_TOKENS = {"tiny": 8, "small": 8, "user": 8, "medium": 64, "large": 64, "1.5b": 256}  # --stops forced
LR = {"full": 1e-5, "lora": 3e-4}  # rlx model=tiny's rates


def make_model_dir(size: str, new_tokens: int, root: Path, task: str, forced: bool) -> Path:
    """A saved model + tokenizer; ``forced``: its generation config forces exactly ``new_tokens`` new tokens."""
    import torch
    from transformers import AutoConfig, GenerationConfig, LlamaForCausalLM

    from rlx_cli.engine.base_model import char_llama_config, char_tokenizer

    target = root / f"{size}-{task}-{new_tokens}-{'forced' if forced else 'natural'}"
    if (target / "config.json").exists():
        return target
    if size == "user":
        from scaling import make_model_dir as user_model_dir

        user_model_dir(target)
    elif SIZES[size] is None:
        shutil.copytree(base_dir(size, "sums" if task == "user" else task), target)
    else:
        tok = char_tokenizer()
        torch.manual_seed(0)
        model = LlamaForCausalLM(char_llama_config(SIZES[size]))  # random weights: only the cost is measured
        model.save_pretrained(target, safe_serialization=True)
        tok.save_pretrained(target)
    if not forced:
        return target
    gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(target))
    gen.min_new_tokens = new_tokens
    gen.save_pretrained(target)
    return target


def base_dir(size: str, task: str) -> Path:
    """The built-in base model ``model=size`` for ``task``, built once (minutes) and cached in $RLX_HOME."""
    from rlx_cli.config.compose import compose
    from rlx_cli.engine.base_model import ensure_base_model
    from rlx_cli.loops.build import build_task
    from rlx_cli.loops.progress import Progress

    cfg = compose([f"task={task}", f"model={size}"])
    return ensure_base_model(cfg.model, cfg.task, build_task(cfg.task), Progress())


def task_config(task: str):
    """``task=...``'s composed config: its term range and response budget."""
    from rlx_cli.config.compose import compose

    return compose([f"task={task}"])


def budget(task: str) -> int:
    """The answers' budget with natural stops: the task's ``rollout.max_new_tokens``; the user's task: 8 tokens."""
    return NEW_TOKENS["user"] if task == "user" else task_config(task).rollout.max_new_tokens


def task_overrides(args) -> list[str]:
    """rlx's task: the built-in one, or the user's model and prompt file as a user runs them."""
    return ["model=hf", "task=jsonl", f"task.path={args.rows}"] if args.task == "user" else [f"task={args.task}"]


def rlx_worker(args) -> dict:
    """``rlx train algo=grpo`` in this process, its step starts and phases timed by light wrappers."""
    import torch

    from rlx_cli.engine import logprobs
    from rlx_cli.loops import loop, run
    from rlx_cli.loops.overlap import SamplerProcess
    from rlx_cli.sampling import fast_rollout

    timers = Timers()
    loop.sample_groups = _starting(timers, loop.sample_groups, 2)
    SamplerProcess.take = _starting(timers, timers.wrap(SamplerProcess.take, "generate"), 1)  # overlap: the wait
    logprobs.Scorer.forward = timers.wrap(logprobs.Scorer.forward, "logp", when=lambda: not torch.is_grad_enabled())
    _patch_generate(timers)
    fast_rollout.decode = timers.wrap(fast_rollout.decode, "generate")  # rollout=fast's loop, in place of generate
    out_dir = tempfile.mkdtemp(prefix="rlx-bench-")
    overrides = [
        "algo=grpo",
        *task_overrides(args),
        f"rollout={args.rollout}",
        f"model.path={args.model_dir}",
        f"model.finetune={args.finetune}",
        f"trainer.lr={LR[args.finetune]}",
        f"trainer.steps={args.warmup + args.steps + 1}",
        "trainer.eval_every=0",
        "trainer.ckpt_every=0",
        "trainer.minibatches=1",
        f"trainer.threads={args.threads}",
        f"trainer.device={args.device}",
        f"trainer.precision={args.precision}",
        f"model.activation_checkpointing={str(args.checkpointing).lower()}",
        f"rollout.max_new_tokens={args.new_tokens}",
        f"trainer.output_dir={out_dir}",
        f"tracking={args.rlx_tracking}",
        *args.rlx_set,
    ]
    run.train_command(overrides)
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"overrides": overrides, **timers.summary(args.warmup)}


def _starting(timers: Timers, fn, step_at: int):
    """``fn`` starting each step's clock; its argument number ``step_at`` is the step."""

    def wrapped(*args):
        if args[step_at] > 0:  # value pretraining samples with negative steps
            timers.start_step()
        return fn(*args)

    return wrapped


def _patch_generate(timers: Timers) -> None:
    from transformers.generation.utils import GenerationMixin

    GenerationMixin.generate = timers.wrap(GenerationMixin.generate, "generate")


def trl_worker(args) -> dict:
    """TRL's GRPOTrainer on the same model directory, prompts, reward and optimizer."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    timers = Timers()
    _patch_generate(timers)
    GRPOTrainer._get_per_token_logps_and_entropies = timers.wrap(
        GRPOTrainer._get_per_token_logps_and_entropies, "logp", when=lambda: not torch.is_grad_enabled()
    )
    steps = args.warmup + args.steps + 1
    task, reward = trl_task(args)
    problems = [p for step in range(1, steps + 1) for p in task.train_problems(16, seed=0, step=step)]
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            timers.start_step()

        def on_train_end(self, *_, **__):
            timers.start_step()  # closes the last step

    peft_config = None
    if args.finetune == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    out_dir = tempfile.mkdtemp(prefix="trl-bench-")
    config = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=128,  # completions, not prompts: 16 prompts x 8
        num_generations=8,
        max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens} if args.stops == "forced" else {},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="grpo",  # per-sequence token mean, then the mean: rlx's seq_mean_token_mean
        scale_rewards="group",
        learning_rate=LR[args.finetune],
        adam_beta1=0.9,
        adam_beta2=0.98,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=10,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=args.precision == "bf16-mixed",  # autocast over the float32 model: float32 masters, as rlx's
        gradient_checkpointing=args.checkpointing,
        use_cpu=args.device == "cpu",
        dataloader_num_workers=0,
        shuffle_dataset=False,
        disable_tqdm=True,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[StepClock()],
    )
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)
    return timers.summary(args.warmup)


def trl_task(args):
    """(the task whose prompts rlx draws, TRL's reward function): the sums and their verifier, or the user's file
    and an exact match of the stripped completion."""
    from rlx_cli.sampling.tasks import Problem, SumsTask

    if args.task == "user":
        from rlx_cli.config.compose import compose
        from rlx_cli.loops.build import build_task

        def exact_match(prompts, completions, answer, **_):
            return [float(c.strip() == a) for c, a in zip(completions, answer)]

        return build_task(compose(["task=jsonl", f"task.path={args.rows}"]).task), exact_match
    terms = task_config(args.task).task

    def sums_reward(prompts, completions, answer, **_):
        return [SumsTask.score(c, Problem(p, a)) for p, c, a in zip(prompts, completions, answer)]

    return SumsTask(min_terms=terms.min_terms, max_terms=terms.max_terms, eval_size=1, eval_seed=0), sums_reward


def worker_main(args) -> None:
    one_thread(args.threads)
    start = time.perf_counter()
    before = load()
    result = (rlx_worker if args.worker == "rlx" else trl_worker)(args)
    result.update(tool=args.worker, total_s=time.perf_counter() - start, peak_rss_mib=peak_rss_mib())
    if args.device == "cuda":
        import torch

        result.update(gpu_peak_gib=torch.cuda.max_memory_allocated() / 2**30, gpu=torch.cuda.get_device_name())
    result.update(load_before=before, load_after=load())
    Path(args.out).write_text(json.dumps(result))
