"""``rlx train`` on one GPU at real model shapes: Qwen2.5-0.5B-, 1.5B- and 7B-shaped models built from config
(random weights, rlx's character tokenizer; nothing downloaded) under ``trainer.precision=bf16-mixed``, activation
checkpointing and a token budget, 64 prompts x 4 answers x 1,024 new tokens. Per run: the last step's time split
(``perf/generate_s``, ``perf/logprobs_s``, ``perf/update_s``), tokens/s, peak GPU memory and the update's MFU;
for ``--profile``'s run, one step more whose update runs under ``torch.profiler`` (its table in the JSON).

    python benchmarks/gpu/rlx_train.py                                 # RUNS but speed.py's -fast, -eager
    python benchmarks/gpu/rlx_train.py --runs 1.5b-grpo-full 7b-grpo-lora
    python benchmarks/gpu/rlx_train.py --device cpu --shape tiny --new-tokens 8 --prompts 4   # the same on the CPU

Random weights put EOS at about 1/151,936 a token, so nearly every answer runs to 1,024 tokens: the work is fixed
without suppressing EOS (``train/truncated_frac`` in the JSON says how fixed). Each run is ``rlx train`` with
``tracking=none`` and ``eval.max_new_tokens=1`` (evaluation is not what is measured), in a worker process
(``train_worker.py``: every step's metrics, the profile; its output in ``--work``/NAME.log, whose tail a cut or
failed run's entry holds); the JSON (``--json``) names the device and is rewritten after every run, so a run cut
at ``--deadline-s`` leaves the others' figures. MFU = the model FLOPs of the update (6 N per token for full
fine-tuning, 4 N for LoRA, whose frozen weights get no gradient; plus attention) over ``perf/update_s`` and the
GPU's dense bf16 peak; activation checkpointing's recomputed forward is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from generate_mfu import PEAK_TFLOPS  # this script's folder: the GPUs' dense bf16 peaks

QWEN25 = {  # Qwen2.5's published shapes (config.json of each size)
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=1000, tie_word_embeddings=True),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=8000, tie_word_embeddings=True),  # a CPU's size
}  # fmt: skip
FAST = ["rollout.cuda_graphs=auto", "trainer.compile=true"]  # issue 51: graphs on a GPU, compiled layers
EAGER = ["rollout.cuda_graphs=false", "trainer.compile=false"]  # as rlx ran before them
OVERLAP = ["rollout.overlap=true"]  # the next step sampled in a process of its own (loops/overlap.py)
# name -> (shape, steps, overrides); the first step warms up, the last is reported
RUNS = {
    "1.5b-grpo-full": ("1.5b", 2, ["algo=grpo", "model.finetune=full"]),
    "7b-grpo-lora": ("7b", 1, ["algo=grpo", "model.finetune=lora"]),
    "1.5b-grpo-lora": ("1.5b", 2, ["algo=grpo", "model.finetune=lora"]),
    "0.5b-vapo-full": ("0.5b", 2, ["algo=vapo", "model.finetune=full", "value_pretrain.steps=1"]),
    "0.5b-grpo-full": ("0.5b", 2, ["algo=grpo", "model.finetune=full"]),
    "1.5b-grpo-full-fast": ("1.5b", 2, ["algo=grpo", "model.finetune=full", *FAST]),  # speed.py's
    "1.5b-grpo-full-eager": ("1.5b", 2, ["algo=grpo", "model.finetune=full", *EAGER]),
    "7b-grpo-lora-fast": ("7b", 2, ["algo=grpo", "model.finetune=lora", *FAST]),  # step 1 compiles
    # speed.py's overlap part (issue 59): the same lag-1 run sequential and with the sampler process
    "0.5b-grpo-full-lag1": ("0.5b", 4, ["algo=grpo", "model.finetune=full", "rollout.lag=1", *EAGER]),
    "0.5b-grpo-full-overlap": ("0.5b", 4, ["algo=grpo", "model.finetune=full", "rollout.lag=1", *OVERLAP, *EAGER]),
}
DEFAULT_RUNS = list(RUNS)[:5]
KEYS = (
    "perf/step_s",
    "perf/generate_s",
    "perf/sample_wait_s",
    "perf/logprobs_s",
    "perf/update_s",
    "perf/sync_s",
    "perf/tokens_per_s",
    "perf/seq_tokens",
    "perf/gpu_peak_gib",
    "train/response_len",
    "train/truncated_frac",
    "train/reward",
    "train/rollout_kl",
    "train/sampler_logp_gap_max",
)


def qwen2(shape: str, device: str, dtype):
    """A Qwen2 causal LM of ``shape`` with random weights (seed 0) in ``dtype`` on ``device``, its special tokens
    rlx's character tokenizer's."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlx_cli.engine.base_model import char_tokenizer

    tokenizer = char_tokenizer()
    config = Qwen2Config(
        **QWEN25[shape],
        max_position_embeddings=4096,
        rope_theta=1e6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(dtype)


def make_model(shape: str, path: Path, device: str) -> int:
    """A Qwen2 model of ``shape`` with random weights in bfloat16 and rlx's character tokenizer, saved at ``path``
    (safetensors) -> its parameter count."""
    import torch

    from rlx_cli.engine.base_model import char_tokenizer

    model = qwen2(shape, device, torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path, safe_serialization=True)
    char_tokenizer().save_pretrained(path)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the training run is another process: this one keeps nothing
    return n


def model_flops(n: int, shape: dict, tokens: float, width: float, lora: bool) -> float:
    """The update's model FLOPs: 6 N (4 N under LoRA) per token plus attention's two matmuls (fwd + bwd)."""
    attention = 6 * shape["num_hidden_layers"] * shape["hidden_size"] * width * tokens
    return (4 if lora else 6) * n * tokens + attention


def run_one(name: str, args, models: dict[str, tuple[Path, int]], deadline: float) -> dict:
    shape, steps, overrides = RUNS[name]
    shape = args.shape or shape
    if shape not in models:
        started = time.perf_counter()
        path = Path(args.work) / f"qwen2.5-{shape}"
        models[shape] = path, make_model(shape, path, args.device)
        print(f"[{name}] built {path} ({models[shape][1] / 1e9:.2f}B params) in {time.perf_counter() - started:.0f} s")
    path, n = models[shape]
    out = Path(args.work) / name
    profiled = name == args.profile
    steps_json, table, log = (Path(args.work) / f"{name}.{what}" for what in ("steps.json", "profile.txt", "log"))
    worker = [sys.executable, str(Path(__file__).with_name("train_worker.py")), f"--steps-json={steps_json}"]
    if profiled:
        steps += 1
        worker += [f"--profile-step={steps}", f"--profile-table={table}"]
    command = [
        *worker, "--", *overrides,
        "model=hf", f"model.path={path}", "model.activation_checkpointing=true",
        f"trainer.device={args.device}", f"trainer.precision={args.precision}",
        f"trainer.micro_batch_tokens={args.micro_batch_tokens}", f"rollout.generate_rows={args.generate_rows}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.new_tokens}", f"trainer.steps={steps}", "trainer.eval_every=0",
        "trainer.ckpt_every=0", "trainer.warmup_steps=1", "task.eval_size=1", "eval.max_new_tokens=1", "tracking=none",
        f"trainer.output_dir={out}",
    ]  # fmt: skip
    print(f"[{name}] {' '.join(command[1:])}", flush=True)
    steps_json.parent.mkdir(parents=True, exist_ok=True)
    steps_json.unlink(missing_ok=True)  # a cut run reports the steps of this run only
    started = time.perf_counter()
    try:
        with log.open("w") as sink:  # the run's own progress lines: where a cut or failed run was
            done = subprocess.run(command, timeout=max(1.0, deadline - time.time()), stdout=sink, stderr=sink)
    except subprocess.TimeoutExpired:
        cut = f"stopped at the deadline after {time.perf_counter() - started:.0f} s"
        done_steps = json.loads(steps_json.read_text()) if steps_json.exists() else []  # the steps it finished
        return {"shape": shape, "cut": cut, "steps_done": done_steps, "log_tail": log.read_text()[-3000:]}
    wall = time.perf_counter() - started
    if done.returncode:
        return {"shape": shape, "failed": done.returncode, "log_tail": log.read_text()[-3000:], "wall_s": wall}
    logged = json.loads(steps_json.read_text())
    metrics = logged[-2] if profiled else logged[-1]  # the profiler slows the step it watches
    result = {"shape": shape, "params": n, "steps": steps, "reported_step": metrics["step"], "wall_s": wall}
    result |= {"command": " ".join(command[command.index("--") + 1 :])}
    result |= {k: metrics[k] for k in KEYS if k in metrics}
    result["in_effect"] = metrics.get("in_effect")  # own forward, compiled, CUDA graphs (train_worker.py)
    result["step_s_each"] = [m["perf/step_s"] for m in logged]
    result["rollout_kl_each"] = [m.get("train/rollout_kl") for m in logged]  # the sampler's log-probs to the trainer's
    if profiled:
        result["profile"] = table.read_text()
    if "perf/update_s" in metrics and "perf/seq_tokens" in metrics:
        rows = args.prompts * args.group
        flops = model_flops(n, QWEN25[shape], metrics["perf/seq_tokens"], metrics["perf/seq_tokens"] / rows,
                            "model.finetune=lora" in overrides)  # fmt: skip
        result["update_tflops"] = flops / metrics["perf/update_s"] / 1e12
        if args.peak_tflops:
            result["update_mfu"] = result["update_tflops"] / args.peak_tflops
    return result


def device_facts(device: str) -> dict:
    import peft
    import torch
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    return versions | {"device": torch.cuda.get_device_name() if device == "cuda" else device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="*", default=DEFAULT_RUNS, choices=list(RUNS))
    parser.add_argument("--shape", choices=list(QWEN25), help="every run at this shape (a smoke test)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak (default: by name)")
    parser.add_argument("--profile", default="1.5b-grpo-full", help="this run's last update under the profiler")
    parser.add_argument("--generate-rows", type=int, default=256, help="rollout.generate_rows: rows per decode loop")
    parser.add_argument("--deadline-s", type=float, default=3600, help="runs still going after this are stopped")
    parser.add_argument("--work", default="outputs/gpu_bench")
    parser.add_argument("--json", default="benchmarks/results/gpu_rlx_train.json")
    args = parser.parse_args()
    deadline = time.time() + args.deadline_s
    facts = device_facts(args.device)
    if args.peak_tflops is None:
        args.peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in facts["device"]), None)
    report = {**facts, "peak_tflops": args.peak_tflops, "settings": vars(args), "runs": {}}
    models: dict[str, tuple[Path, int]] = {}
    for name in args.runs:
        report["runs"][name] = run_one(name, args, models, deadline)
        print(f"[{name}] {json.dumps(report['runs'][name])}", flush=True)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
