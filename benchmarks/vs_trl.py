"""rlx vs TRL's GRPOTrainer on the same GRPO steps: seconds per step, their ratio, and where each spends it.

    python benchmarks/vs_trl.py                       # tiny + medium, LoRA + full, 2 interleaved rounds
    python benchmarks/vs_trl.py --sizes tiny --finetunes lora --steps 8 --warmup 2 --rounds 1   # a smoke run
    python benchmarks/vs_trl.py --sizes tiny --finetunes full --stops natural --rollout fast --threads 2

The same work, per step (the same samples' distribution, the same update): 16 sums prompts x 8 samples, exactly
``--new-tokens`` new tokens (EOS is suppressed until then: ``min_new_tokens`` in the model directory's
generation_config.json, which rlx's HF ``generate`` reads, and in TRL's ``generation_kwargs``), temperature 1,
top-p 1, no top-k; the same saved model
and tokenizer; the sums verifier as the reward; no KL (TRL ``beta=0``; rlx ``algo=grpo`` has ``kl=none``, whose
reference forward runs only every ``kl.measure_every`` steps, for the ``train/kl`` metric); one AdamW step
(lr, betas 0.9/0.98, no weight decay, grad clip 1) on all 128 completions (rlx
``trainer.minibatches=1``; TRL ``per_device_train_batch_size=128``, one iteration); float32, no gradient
checkpointing, ``--threads`` threads each. The same update, not the same arithmetic; rlx does less of it:

- it prefills each distinct prompt once for its group of 8 (``rollout=fast``), and drops a finished row from the
  decode batch (TRL's ``generate`` decodes it on, padded);
- it cuts micro-batches by length (less padding computed) and its last layer skips the prompt's positions;
- it runs only the forward of completions whose advantage is 0 (a group whose answers all scored alike), whose
  gradient is exactly 0 (``trainer.skip_zero_advantage``, on by default); TRL runs their backward too.
  ``--rlx-set trainer.skip_zero_advantage=false`` runs rlx's backward on every completion: the full-arithmetic
  ratio, beside the default's in docs/benchmarks.md. A step is the wall time from one
step's start to the next one's (logging included), medians over ``--steps`` steps after ``--warmup``; each round
runs rlx and TRL back to back, the order alternating between rounds. Breakdown: ``generate`` (the model's generate
call), ``logp`` (forwards without gradient: old/reference log-probs, and rlx's forwards of the completions without
advantage), ``rest`` (the update: forward, backward, optimizer, and bookkeeping).

``--device cuda --precision bf16-mixed --checkpointing``: the same work on a GPU, bfloat16 autocast on both sides
over float32 trained weights (TRL ``bf16=True`` over a float32 model; rlx keeps the weights it does not train, a
LoRA base or a full fine-tune's reference, in bfloat16: ``model.dtype=auto``) and each decoder layer recomputed in
backward (TRL ``gradient_checkpointing``); ``--sizes 1.5b`` is Qwen2.5-1.5B's shape as a Llama with the character
vocabulary:

    python benchmarks/vs_trl.py --device cuda --precision bf16-mixed --checkpointing --sizes 1.5b --finetunes full \
        --rounds 2 --steps 3 --warmup 1 --rlx-tracking none --json benchmarks/results/gpu_vs_trl.json

``--stops natural``: answers end at EOS, as in training (no ``min_new_tokens``; ``--new-tokens`` is then the
budget, by default the task's ``rollout.max_new_tokens``). ``--rollout fast``: rlx samples with its own decode loop
(``rollout=fast``; its ``generate`` phase is that loop), which reads no ``generation_config.json`` and so needs
``--stops natural``. ``--task long_sums``: that task's prompts (3–8 terms), and ``--sizes small`` its built-in base.

``--task user``: a user's task, as a user runs it: rlx ``model=hf task=jsonl task.path=FILE`` (its own defaults
otherwise: ``rollout=fast``, natural stops; ``task.verifier=exact``) on 400 rows ``a+b=`` -> ``a+b``
(``_common.write_user_rows``), by default on ``--sizes user``, benchmarks/scaling.py's 10.6M Qwen2 with a 32,000-token
vocabulary (random weights), answers of at most 8 tokens; TRL the same rows, drawn as rlx draws them, with the
stripped completion's exact match as the reward. ``--rlx-set rollout.lag=1 rollout.overlap=true`` samples rlx's
next step in a process of its own (one thread each, ``--threads``) during the update; TRL has no such mode, and
rlx's ``generate`` is then its wait for that batch:

    python benchmarks/vs_trl.py --task user --finetunes full --rounds 3 --json benchmarks/results/vs_trl_user_task.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import HERE, load, median, run_worker, table, versions, write_json, write_user_rows  # noqa: E402
from vs_trl_workers import NEW_TOKENS, SIZES, budget, make_model_dir, worker_main  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), help="default tiny medium; --task user: user")
    parser.add_argument("--finetunes", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    parser.add_argument("--steps", type=int, default=20, help="measured steps per run (after --warmup)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="rlx and TRL back to back, order alternating")
    parser.add_argument("--new-tokens", type=int, default=None, help="override the size's new tokens (the budget)")
    parser.add_argument("--stops", choices=["forced", "natural"], help="natural: answers end at EOS (user's default)")
    parser.add_argument("--rollout", choices=["hf", "fast"], help="rlx's sampler: default hf; --task user: fast")
    parser.add_argument("--task", default="sums", choices=["sums", "long_sums", "user"], help="the prompts (and base)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per tool")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"], help="bf16-mixed: TRL bf16")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing on both sides")
    parser.add_argument("--rlx-tracking", default="mlflow", choices=["mlflow", "none"])
    parser.add_argument("--rlx-set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for rlx train")
    parser.add_argument("--json", default=None, help="where to write the results (default benchmarks/results/)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("--collect", metavar="DIR", help="summarise the worker files a cut-short run left in DIR")
    # worker mode (internal)
    parser.add_argument("--worker", choices=["rlx", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--finetune", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args()
    user = args.task == "user"  # a user's defaults: rollout=fast, answers ending at EOS, the user's model
    args.sizes = args.sizes or (["user"] if user else ["tiny", "medium"])
    args.stops = args.stops or ("natural" if user else "forced")
    args.rollout = args.rollout or ("fast" if user else "hf")
    if args.rollout == "fast" and args.stops == "forced":
        parser.error("--rollout fast reads no generation_config.json, so it cannot force a length: use --stops natural")
    if args.worker:
        args.new_tokens = int(args.new_tokens)
        return worker_main(args)

    plan = [(s, f) for s in args.sizes for f in args.finetunes]
    natural_budget = budget(args.task)
    if args.collect:  # a run cut short: summarise the workers' files it left
        runs = []
        for path in sorted(Path(args.collect).glob("*-*-*-*.json")):
            tool, size, finetune, r = path.stem.split("-")
            runs.append({**json.loads(path.read_text()), "size": size, "finetune": finetune, "round": int(r)})
        return summarise(runs, plan, args)
    if args.dry_run:
        for s, f in plan:
            rlx = " ".join([f"rollout={args.rollout}", *args.rlx_set])
            model = SIZES[s] or ("scaling.py's Qwen2" if s == "user" else "the built-in base")
            print(f"{s} {f}: {new_tokens_of(s, args, natural_budget)} new tokens ({args.stops}), task {args.task}, "
                  f"rlx {rlx}, {model}")  # fmt: skip
        return
    scratch = Path(tempfile.mkdtemp(prefix="vs-trl-"))
    rows = ["--rows", str(write_user_rows(scratch / "user_rows.jsonl"))] if user else []
    runs = []
    for r in range(args.rounds):
        for size, finetune in plan:
            new_tokens = new_tokens_of(size, args, natural_budget)
            model_dir = make_model_dir(size, new_tokens, scratch, args.task, forced=args.stops == "forced")
            order = ("rlx", "trl") if r % 2 == 0 else ("trl", "rlx")
            for tool in order:
                out = scratch / f"{tool}-{size}-{finetune}-{r}.json"
                argv = [
                    sys.executable,
                    __file__,
                    "--worker",
                    tool,
                    "--model-dir",
                    str(model_dir),
                    "--finetune",
                    finetune,
                    "--new-tokens",
                    str(new_tokens),
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                    "--rlx-tracking",
                    args.rlx_tracking,
                    "--stops",
                    args.stops,
                    "--rollout",
                    args.rollout,
                    "--task",
                    args.task,
                    "--threads",
                    str(args.threads),
                    "--device",
                    args.device,
                    "--precision",
                    args.precision,
                    *(["--checkpointing"] if args.checkpointing else []),
                    *(["--rlx-set", *args.rlx_set] if args.rlx_set else []),
                    *rows,
                    "--out",
                    str(out),
                ]
                threads = str(args.threads)
                env = {"MLFLOW_TRACKING_URI": f"sqlite:///{scratch}/mlflow.db", "OMP_NUM_THREADS": threads}
                env["MKL_NUM_THREADS"] = threads
                data = run_worker(argv, out, env=env)
                data.update(size=size, finetune=finetune, round=r, new_tokens=new_tokens)
                runs.append(data)
                print(
                    f"round {r} {size:6s} {finetune:4s} {tool}: {data['step_s']:.3f} s/step "
                    f"(gen {data['generate_s']:.3f}, logp {data['logp_s']:.3f}, rest {data['rest_s']:.3f}) "
                    f"rss {data['peak_rss_mib']:.0f} MiB, load {data['load_before']['load1']}",
                    flush=True,
                )
    summarise(runs, plan, args)
    shutil.rmtree(scratch, ignore_errors=True)


def new_tokens_of(size: str, args, natural_budget: int) -> int:
    """``--new-tokens``, else the size's forced length or, with natural stops, the task's budget."""
    if args.new_tokens is not None:
        return args.new_tokens
    return NEW_TOKENS[size] if args.stops == "forced" else natural_budget


def summarise(runs: list[dict], plan, args) -> None:
    """The table (medians over rounds; the ratio per round, rlx over TRL) and the JSON."""
    rows, summary = [], []
    for size, finetune in plan:
        pick = {
            t: [x for x in runs if x["size"] == size and x["finetune"] == finetune and x["tool"] == t]
            for t in ("rlx", "trl")
        }
        by_round = {t: {x["round"]: x for x in pick[t]} for t in pick}
        rounds = sorted(set(by_round["rlx"]) & set(by_round["trl"]))
        if not rounds:
            continue
        ratios = [by_round["rlx"][r]["step_s"] / by_round["trl"][r]["step_s"] for r in rounds]
        entry = {"size": size, "finetune": finetune, "ratios": ratios, "ratio": median(ratios)}
        for t in ("rlx", "trl"):
            entry[t] = {k: median([x[k] for x in pick[t]]) for k in ("step_s", "generate_s", "logp_s", "rest_s")}
            entry[t]["peak_rss_mib"] = max(x["peak_rss_mib"] for x in pick[t])
            if all("gpu_peak_gib" in x for x in pick[t]):
                entry[t]["gpu_peak_gib"] = max(x["gpu_peak_gib"] for x in pick[t])
        summary.append(entry)

        def cell(t, e=entry):
            d = e[t]
            return f"{d['step_s']:.3f} ({d['generate_s']:.3f} / {d['logp_s']:.3f} / {d['rest_s']:.3f})"

        rows.append(
            [
                size,
                finetune,
                cell("rlx"),
                cell("trl"),
                " ".join(f"{x:.2f}" for x in ratios),
                f"{entry['ratio']:.2f}",
                f"{entry['rlx']['peak_rss_mib']:.0f} / {entry['trl']['peak_rss_mib']:.0f}",
            ]
        )
    headers = [
        "size",
        "finetune",
        "rlx s/step (gen / logp / rest)",
        "TRL s/step (gen / logp / rest)",
        "rlx/TRL per round",
        "ratio",
        "peak RSS MiB rlx / TRL",
    ]
    print(table(headers, rows))
    loads = [x[k]["load1"] for x in runs for k in ("load_before", "load_after") if k in x]
    if loads:
        print(f"load (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} on {load()['cores']} cores")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    path = write_json(
        "vs_trl",
        {
            "args": {k: v for k, v in vars(args).items() if v is not None},
            "commit": commit.stdout.strip(),
            "load1_range": [min(loads), max(loads)] if loads else None,
            "load_at_end": load(),
            "versions": versions("rlx", "trl", "transformers", "torch", "peft", "accelerate"),
            "summary": summary,
            "runs": runs,
            "sizes": {k: SIZES[k] for k in args.sizes},
        },
        args.json,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
