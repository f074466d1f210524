"""vLLM vs HF generate on the same rollout batch, and the cost of keeping the engine in step with the policy.

    RLX_HOME=... HF_HUB_OFFLINE=1 python benchmarks/vllm_vs_hf.py --repeats 5 --out vllm_vs_hf.json

One process, one torch thread, the default config (``prompts_per_step`` x ``group_size`` prompts of RL step 1,
``max_new_tokens``, temperature 1). HF and vLLM take turns on each repeat, so a busy machine slows both alike;
the table gives medians and the median of the per-repeat ratios. Then the time of one weight sync for full
fine-tuning and, for LoRA, two engines on one policy taking turns, merged weights vs a new adapter: the sync
and a rollout batch after it.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from rlx_cli.config.compose import compose, job_config
from rlx_cli.loops.build import build
from rlx_cli.loops.progress import Progress
from rlx_cli.sampling.rollout import HFSampler


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def rollout_batch(parts, cfg) -> list[str]:
    problems = parts.task.train_problems(cfg.rollout.prompts_per_step, seed=cfg.seed, step=1, draw=0)
    return [p.prompt for p in problems for _ in range(cfg.rollout.group_size)]


def tokens_per_s(sampler, policy, prompts, cfg) -> float:
    batch, seconds = timed(
        lambda: sampler.generate(policy, prompts, temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)
    )
    return batch.response_mask.sum().item() / seconds


def generation(repeats: int) -> tuple[dict, list[float]]:
    """Tokens/s of HF generate and vLLM on one batch, alternating; and the full-fine-tuning sync times."""
    cfg = job_config(compose(["rollout=vllm", "trainer.threads=1"]))
    parts = build(cfg, Progress(quiet=True))
    policy, hf = parts.models.policy, HFSampler(parts.models.tokenizer)
    prompts = rollout_batch(parts, cfg)
    parts.sampler.generate(policy, prompts[:8], temperature=1.0, max_new_tokens=8)  # warm-up
    runs = [(tokens_per_s(hf, policy, prompts, cfg), tokens_per_s(parts.sampler, policy, prompts, cfg))
            for _ in range(repeats)]  # fmt: skip
    syncs = [timed(lambda: parts.sampler.sync(policy))[1] for _ in range(repeats)]
    result = {
        "rows": len(prompts),
        "hf_tokens_per_s": statistics.median(h for h, _ in runs),
        "vllm_tokens_per_s": statistics.median(v for _, v in runs),
        "ratio": statistics.median(v / h for h, v in runs),
    }
    return result, syncs


def lora(repeats: int) -> dict:
    """Two engines on one LoRA policy, merged weights vs a new adapter, taking turns: sync s and tokens/s after."""
    from rlx_cli.sampling.vllm_rollout import VLLMSampler

    cfg = job_config(compose(["rollout=vllm", "trainer.threads=1", "model.finetune=lora"]))
    parts = build(cfg, Progress(quiet=True))
    policy, prompts = parts.models.policy, rollout_batch(parts, cfg)
    rollout = cfg.rollout.copy()
    rollout.lora_sync = "adapter"
    engines = {
        "merged": parts.sampler,
        "adapter": VLLMSampler(parts.sampler.llm.llm_engine.model_config.model, parts.models.tokenizer, rollout,
                               cfg.model, chat_template=False, seed=cfg.seed, dtype=parts.sampler.dtype),
    }  # fmt: skip
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.01 * torch.randn(p.shape, generator=noise))  # a trained adapter, not LoRA's zero start
    syncs = {mode: [] for mode in engines}
    speeds = {mode: [] for mode in engines}
    for _ in range(repeats):
        for mode, engine in engines.items():
            syncs[mode].append(timed(lambda: engine.sync(policy))[1])  # noqa: B023 (called at once)
            speeds[mode].append(tokens_per_s(engine, policy, prompts, cfg))
    return {
        f"lora_{mode}": {"sync_s": statistics.median(syncs[mode]), "tokens_per_s": statistics.median(speeds[mode])}
        for mode in engines
    } | {"lora_adapter_over_merged": statistics.median(a / m for a, m in zip(speeds["adapter"], speeds["merged"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="vllm_vs_hf.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # before the first engine: vLLM's CPU worker then locks torch's thread count
    gen, syncs = generation(args.repeats)
    result = {**gen, "full_sync_s": statistics.median(syncs)}
    gc.collect()  # the first engine's KV cache
    result.update(lora(args.repeats))
    print(f"| rollout batch ({gen['rows']} rows) | tokens/s |\n| --- | --- |")
    print(f"| HF generate | {gen['hf_tokens_per_s']:.0f} |\n| vLLM | {gen['vllm_tokens_per_s']:.0f} |")
    print(f"| vLLM / HF (median of {args.repeats} paired runs) | {gen['ratio']:.2f}x |\n")
    print("| weight sync | sync s | tokens/s after |\n| --- | --- | --- |")
    print(f"| full fine-tuning (reload_weights) | {result['full_sync_s']:.3f} | |")
    for mode in ("merged", "adapter"):
        r = result[f"lora_{mode}"]
        print(f"| LoRA {mode} | {r['sync_s']:.3f} | {r['tokens_per_s']:.0f} |")
    print(f"\nLoRA adapter / merged tokens/s (median of paired runs): {result['lora_adapter_over_merged']:.2f}x")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
