"""GPU figures at about 0.5B parameters (random weights, built from config): tokens/s of HF ``generate`` vs vLLM,
and the model FLOPs utilisation (MFU) of one RL update (forward + backward + AdamW) in bf16.

    python benchmarks/gpu/generate_mfu.py                     # on a GPU: HF generate, vLLM if installed, MFU
    python benchmarks/gpu/generate_mfu.py --dry-run           # print the plan and the model's size (no GPU)
    python benchmarks/gpu/generate_mfu.py --size tiny --device cpu --batch 8 --new-tokens 8 --reps 1  # smoke

Needs only torch and transformers (vLLM optional: without it that row says so); rlx itself is not imported,
so the script runs on a bare GPU image. The workload mirrors an rlx step: ``--batch`` sequences (16 prompts x
8 samples) of ``--prompt-len`` random prompt tokens and exactly ``--new-tokens`` sampled tokens (temperature 1,
EOS ignored). Tokens/s counts new tokens; MFU = 6·N·tokens (+ attention) / time / the GPU's peak bf16 FLOP/s
(``--peak-tflops``; H100/H200 SXM dense: 989). Medians over ``--reps`` after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

SIZES = {  # Qwen2.5-0.5B's shape (494M parameters, tied embeddings), and a smoke size
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=256,
    ),
}
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


def build(size: str, dtype, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SIZES[size], max_position_embeddings=4096, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype), config


def n_params(config) -> int:
    h, i, n, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    return n * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + v * h + h


def sync(device):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, reps: int, device: str) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return out


def hf_generate(model, args, device) -> dict:
    import torch

    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.prompt_len), device=device)
    attn = torch.ones_like(ids)

    def run():
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=0,
                eos_token_id=None,
            )

    times = timed(run, args.reps, device)
    return {"s": statistics.median(times), "tokens_per_s": args.batch * args.new_tokens / statistics.median(times)}


def vllm_generate(model_dir: Path, args) -> dict:
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError:
        return {"skipped": "vllm is not installed (pip install 'rlx[vllm]')"}
    import random

    llm = LLM(
        model=str(model_dir),
        dtype="bfloat16",
        skip_tokenizer_init=True,
        seed=0,
        gpu_memory_utilization=args.vllm_memory,
        max_model_len=args.prompt_len + args.new_tokens + 8,
    )
    rng = random.Random(0)
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(3, args.vocab) for _ in range(args.prompt_len)])
        for _ in range(args.batch)
    ]
    params = SamplingParams(
        temperature=1.0,
        top_p=1.0,
        max_tokens=args.new_tokens,
        min_tokens=args.new_tokens,
        ignore_eos=True,
        detokenize=False,
    )
    times = timed(lambda: llm.generate(prompts, params, use_tqdm=False), args.reps, "cpu")
    return {"s": statistics.median(times), "tokens_per_s": args.batch * args.new_tokens / statistics.median(times)}


def update_mfu(model, config, args, device, peak_tflops: float | None) -> dict:
    """One policy update on the whole batch: forward (log-probs of the response), backward, AdamW step."""
    import torch

    model.train()
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.startswith("cuda"))
    length = args.prompt_len + args.new_tokens
    ids = torch.randint(3, config.vocab_size, (args.batch, length), device=device)
    micro = args.micro_batch or args.batch

    def run():
        optimizer.zero_grad(set_to_none=True)
        for rows in ids.split(micro):
            logits = model(input_ids=rows).logits[:, args.prompt_len - 1 : -1].float()
            logp = logits.log_softmax(-1).gather(-1, rows[:, args.prompt_len :, None]).squeeze(-1)
            (-logp.mean() * rows.shape[0] / args.batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    times = timed(run, args.reps, device)
    s = statistics.median(times)
    tokens = args.batch * length
    n = n_params(config)
    attention = 6 * config.num_hidden_layers * config.hidden_size * length * tokens  # 2 matmuls, x3 for fwd+bwd
    flops = 6 * n * tokens + attention
    out = {"s": s, "tokens_per_s": tokens / s, "params": n, "flops": flops, "tflops": flops / s / 1e12}
    if args.grad_checkpointing:
        out["note"] = "gradient checkpointing recomputes the forward; MFU counts 6N per token only"
    if peak_tflops:
        out["mfu"] = out["tflops"] / peak_tflops
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="0.5b", choices=list(SIZES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=128, help="sequences per step (16 prompts x 8 samples)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward in the update")
    parser.add_argument("--grad-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    parser.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM's gpu_memory_utilization")
    parser.add_argument("--skip", nargs="*", default=[], choices=["hf", "vllm", "mfu"])
    parser.add_argument("--json", default="benchmarks/results/gpu.json")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the model size; no GPU needed")
    args = parser.parse_args()

    from transformers import LlamaConfig

    config = LlamaConfig(**SIZES[args.size])
    plan = {"size": args.size, "params": n_params(config), **{k: v for k, v in vars(args).items() if k != "dry_run"}}
    if args.dry_run:
        print(json.dumps(plan, indent=2))
        return
    import torch

    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --device cpu --size tiny for a smoke run, or --dry-run")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    result = {"device": name, "peak_tflops": peak, "versions": {"torch": torch.__version__}, "plan": plan}
    import transformers

    result["versions"]["transformers"] = transformers.__version__
    model, config = build(args.size, dtype, device)
    if "hf" not in args.skip:
        model.eval()
        result["hf_generate"] = hf_generate(model, args, device)
        print(f"HF generate: {result['hf_generate']['tokens_per_s']:.0f} new tokens/s", flush=True)
    if "vllm" not in args.skip:
        if not device.startswith("cuda"):
            result["vllm_generate"] = {"skipped": "vLLM runs on a GPU here"}
        else:
            with tempfile.TemporaryDirectory() as tmp:
                model.save_pretrained(tmp, safe_serialization=True)
                args.vocab = config.vocab_size
                result["vllm_generate"] = vllm_generate(Path(tmp), args)
        print(f"vLLM: {result['vllm_generate']}", flush=True)
        if "tokens_per_s" in result.get("vllm_generate", {}) and "hf_generate" in result:
            result["vllm_over_hf"] = result["vllm_generate"]["tokens_per_s"] / result["hf_generate"]["tokens_per_s"]
    if "mfu" not in args.skip:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        result["update"] = update_mfu(model, config, args, device, peak)
        if device.startswith("cuda"):
            result["update"]["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(f"update: {json.dumps(result['update'])}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
