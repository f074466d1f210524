"""Peak memory and step time of ``rlx train`` as samples per step and answer length grow, at a fixed budget.

    python benchmarks/scaling.py                                   # samples 16/64/256 at 64 tokens, 64..512 tokens
    python benchmarks/scaling.py --rlx /old/venv/bin/rlx --no-budget --json before.json   # an install before the keys
    python benchmarks/scaling.py --samples 16 256 --lengths 64 --repeats 3   # the spread of peak RSS run to run
    python benchmarks/scaling.py --dry-run                         # print the commands

The model: an 11M-parameter Qwen2 built from config with random weights (hidden 256, 4 layers, 4 heads with 2
key/value heads, intermediate 512, vocabulary 32,000, tied head; the same shape as ``../shared/notes/scale.md``'s
measurement) and a character tokenizer padded to 32,000 tokens. The work is fixed: the built-in sums prompts, exactly
``N`` new tokens per answer (EOS suppressed by ``min_new_tokens`` in the model's generation_config.json, which rlx's
HF ``generate`` reads), full fine-tuning, ``algo=grpo``, one minibatch, 3 steps, 16 held-out prompts at step 0 and
the end. The budget: ``trainer.micro_batch_tokens`` (``--budget``) and ``rollout.generate_rows`` (``--rows``), left
out with ``--no-budget`` for an install that predates them. Each point is its own ``rlx train`` process with one
thread; peak RSS is the kernel's figure for that child (``wait4``), the step time the median ``perf/step_s`` of
steps 2 and 3 from its MLflow store.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, median, table, versions, write_json  # noqa: E402

ARCH = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True)  # fmt: skip
SAMPLES = (16, 64, 256)  # prompts x 8 samples, at 64 new tokens
LENGTHS = (64, 128, 256, 512)  # new tokens, at 16 samples


def make_model_dir(root: Path) -> Path:
    """The Qwen2 above with random weights and a padded character tokenizer, saved at ``root``."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from rlx_cli.engine.base_model import CHARS, SPECIAL

    symbols = SPECIAL + list(CHARS)
    vocab = {tok: i for i, tok in enumerate(symbols + [f"<x{i}>" for i in range(ARCH["vocab_size"] - len(symbols))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    config = Qwen2Config(**ARCH, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", flush=True)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def fixed_length(model_dir: Path, new_tokens: int) -> None:
    """Exactly ``new_tokens`` per answer: EOS is suppressed until then."""
    from transformers import GenerationConfig

    GenerationConfig(min_new_tokens=new_tokens, bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(
        model_dir
    )


def step_times(store: Path) -> list[float]:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}")
    client = mlflow.tracking.MlflowClient()
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    history = sorted(client.get_metric_history(run.info.run_id, "perf/step_s"), key=lambda m: m.step)
    return [m.value for m in history]


def run_point(rlx: str, model_dir: Path, samples: int, new_tokens: int, budget: list[str]) -> dict:
    """One ``rlx train`` process -> its peak RSS (MiB), wall time and step times."""
    fixed_length(model_dir, new_tokens)
    work = Path(tempfile.mkdtemp(prefix="rlx-scaling-"))
    argv = [
        rlx, "train", "algo=grpo", "model=hf", f"model.path={model_dir}", "model.finetune=full", "trainer.lr=1e-6",
        f"rollout.prompts_per_step={samples // 8}", "rollout.group_size=8", f"rollout.max_new_tokens={new_tokens}",
        "trainer.minibatches=1", "trainer.steps=3", "trainer.eval_every=0", "trainer.ckpt_every=0",
        "trainer.threads=1", "task=sums", "task.eval_size=16", f"trainer.output_dir={work / 'out'}", *budget,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}  # fmt: skip
    before, start = load(), time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise SystemExit(f"failed: {' '.join(argv)}")
    wall = time.perf_counter() - start
    steps = step_times(work / "mlflow.db")
    shutil.rmtree(work, ignore_errors=True)
    return {
        "samples": samples, "new_tokens": new_tokens, "peak_rss_mib": usage.ru_maxrss / 1024, "wall_s": wall,
        "step_s": median(steps[1:]), "step_s_all": steps, "load_before": before, "load_after": load(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rlx", default=shutil.which("rlx") or "rlx", help="the rlx executable to measure")
    parser.add_argument("--budget", type=int, default=2048, help="trainer.micro_batch_tokens")
    parser.add_argument("--rows", type=int, default=16, help="rollout.generate_rows")
    parser.add_argument("--no-budget", action="store_true", help="leave the budget keys out (an older rlx)")
    parser.add_argument("--samples", type=int, nargs="+", default=list(SAMPLES))
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--repeats", type=int, default=1, help="rounds over every point (peak RSS varies by run)")
    parser.add_argument("--json", default=None, help="where to write the results (default benchmarks/results/)")
    parser.add_argument("--dry-run", action="store_true", help="print the points and exit")
    args = parser.parse_args()

    budget = [f"trainer.micro_batch_tokens={args.budget}", f"rollout.generate_rows={args.rows}"]
    budget = [] if args.no_budget else budget
    points = [(s, 64) for s in args.samples] + [(16, n) for n in args.lengths if n != 64 or 16 not in args.samples]
    if args.dry_run:
        for samples, new_tokens in points:
            print(f"{samples} samples x {new_tokens} new tokens: {args.rlx} train ... {' '.join(budget)}")
        return
    root = Path(tempfile.mkdtemp(prefix="rlx-scaling-model-"))
    model_dir = make_model_dir(root)
    results = []
    for round_ in range(args.repeats):  # round by round: each point's runs spread over the session's load
        for samples, new_tokens in points:
            result = {**run_point(args.rlx, model_dir, samples, new_tokens, budget), "round": round_}
            print(f"{samples:4d} samples x {new_tokens:4d} tokens: peak RSS {result['peak_rss_mib']:7.0f} MiB, "
                  f"step {result['step_s']:6.2f} s", flush=True)  # fmt: skip
            results.append(result)
    shutil.rmtree(root, ignore_errors=True)
    peaks = {p: [r["peak_rss_mib"] for r in results if (r["samples"], r["new_tokens"]) == p] for p in points}
    base = max(peaks.get((16, 64), [0])) or None
    rows = [
        [samples, new_tokens, " / ".join(f"{p:.0f}" for p in found), f"{max(found) / min(found):.2f}",
         f"{max(found) / base:.2f}" if base else "–",
         f"{median([r['step_s'] for r in results if (r['samples'], r['new_tokens']) == (samples, new_tokens)]):.2f}"]
        for (samples, new_tokens), found in peaks.items()
    ]  # fmt: skip
    print(table(["samples", "new tokens", "peak RSS MiB (each run)", "max / min", "max × 16×64's max", "step s"], rows))
    data = {
        "rlx": args.rlx, "budget": None if args.no_budget else {"micro_batch_tokens": args.budget, "rows": args.rows},
        "arch": ARCH, "versions": versions("torch", "transformers", "peft"), "points": results,
    }  # fmt: skip
    print(f"wrote {write_json('scaling', data, args.json)}")


if __name__ == "__main__":
    main()
