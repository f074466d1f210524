"""rlx at GPU speed (issue 51): the figures of its item 3 on one card, before and after in the same call.

    python benchmarks/gpu/speed.py --out $OUT                       # decode and update (about 5 minutes on a GPU)
    python benchmarks/gpu/speed.py --parts step --out $OUT          # rlx train at 1.5B, graphs and compiled layers
    python benchmarks/gpu/speed.py --parts lora7b --out $OUT        # rlx train at 7B, LoRA, 32 x 4 x 1,024
    python benchmarks/gpu/speed.py --parts trl --out $OUT           # rlx against TRL at 1.5B (TRL's wheels carried)
    python benchmarks/gpu/speed.py --parts overlap --out $OUT       # rollout.overlap's sampler process on the card
    python benchmarks/gpu/speed.py --device cpu --shape tiny --out /tmp/speed   # the CPU smoke run (seconds)

Each part is a process of its own, stopped at ``--part-s`` (480 s), that writes ``speed_<part>.json`` in ``--out``
(the card, the torch, transformers and peft versions, the settings) again as each figure lands, so a cut call keeps
what it measured. Models are Qwen2.5's shapes with random weights (``rlx_train.py``; nothing downloaded).

- ``decode``: rollout=fast's decode loop (``fast_rollout.decode``) over ``--rows`` (256) sampled answers of
  ``--decode-tokens`` (1,024) at the 1.5B shape in bf16, eager against CUDA graphs (``rollout.cuda_graphs``): ms a
  token (the whole loop over its tokens: prefill and captures included, as ``perf/generate_s`` counts them), and the
  share of greedy answers (``--check-tokens`` long) the two give alike.
- ``update``: the forward and backward of one micro-batch (``--micro-batch-tokens``, 16,384: rows of ``--prompt-len``
  + ``--update-tokens``) at the 1.5B shape, full fine-tuning, bf16 autocast over float32 weights, as rlx's update
  runs it (``Scorer``): ``before``, transformers' checkpointed layers (rlx's forward stepped aside for them until
  issue 51); ``own``, rlx's forward checkpointed; ``own_compiled``, the same compiled (``trainer.compile``);
  ``own_compiled_kept``, compiled without checkpointing. Each: ``first_s`` (the first call: compiling), the median
  of ``--reps`` calls after it, tokens/s, MFU (6 N per token plus attention over the card's dense bf16 peak; the
  recomputed forward and the optimizer step not counted) and peak memory.
- ``step`` / ``step_before``: ``rlx_train.py``'s run ``1.5b-grpo-full-fast`` (CUDA graphs, compiled layers; its
  last update under the profiler) / ``1.5b-grpo-full-eager`` (both off): rlx train at 1.5B, 64 x 4 x 1,024.
- ``lora7b``: ``rlx_train.py``'s ``7b-grpo-lora-fast``, 32 prompts: one step's time split and peak memory.
- ``trl``: ``benchmarks/vs_trl.py --device cuda`` at ``--sizes 1.5b``: rlx (``rollout=fast``, graphs, compiled
  layers) against TRL's GRPOTrainer (HF ``generate``), answers ending at EOS, activation checkpointing on both
  sides: the ratio; a cut run's finished workers summarised (``vs_trl.py --collect``).
- ``overlap``: ``rollout.overlap`` on the card (issue 59): ``rlx_train.py``'s ``0.5b-grpo-full-lag1`` and
  ``-overlap``, the same lag-1 run (4 steps, ``--overlap-tokens`` new tokens) sequential and with the sampler process,
  which reads the sampling copy through CUDA IPC. Each step's ``train/rollout_kl`` (the sampler's log-probs against
  the trainer's) should agree between the two to the card's float noise: a sampler that read half-written weights
  would show as a larger one. Also each one's step time, ``perf/generate_s`` and the trainer's ``perf/sample_wait_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import rlx_train  # this script's folder
from generate_mfu import PEAK_TFLOPS

PARTS = ("decode", "update", "step", "step_before", "lora7b", "trl", "overlap")
MODES = ("before", "own", "own_compiled", "own_compiled_kept")
TRAIN_RUNS = {"step": ("1.5b-grpo-full-fast", 64), "step_before": ("1.5b-grpo-full-eager", 64),
              "lora7b": ("7b-grpo-lora-fast", 32)}  # part -> (rlx_train.py's run, prompts)  # fmt: skip
VS_TRL = Path(__file__).resolve().parents[1] / "vs_trl.py"


class Record:
    """A part's JSON at ``path``, written again whenever a figure is set."""

    def __init__(self, path: Path, head: dict):
        self.path, self.data = path, head
        self.save()

    def __setitem__(self, key: str, value) -> None:
        self.data[key] = value
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")


def run_group(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a process group of its own, the whole group killed at ``timeout`` (a part's or
    vs_trl.py's workers would hold the card otherwise)."""
    with subprocess.Popen(command, start_new_session=True, **kwargs) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def load() -> float:
    """The machine's 1-minute load average (a CPU figure means little without it)."""
    return os.getloadavg()[0]


def timed(fn, device: str) -> float:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def decode_part(args, record: Record, deadline: float) -> None:
    import torch

    from rlx_cli.engine.base_model import char_tokenizer
    from rlx_cli.sampling.fast_rollout import Sampling, decode

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    lm, tokenizer = rlx_train.qwen2(args.shape or "1.5b", args.device, dtype).eval(), char_tokenizer()
    groups = -(-args.rows // args.group)
    seeded = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, lm.config.vocab_size, (groups, args.prompt_len), generator=seeded)
    ids = prompts.repeat_interleave(args.group, 0)[: args.rows].to(args.device)  # each prompt a group, in a row
    mask = torch.ones_like(ids)

    def loop(graphs: bool, temperature: float, tokens: int):
        with torch.inference_mode():
            return decode(lm, ids, mask, Sampling(temperature), tokens, tokenizer, graphs)[0]

    for graphs, name in ((False, "eager"), (True, "graphs")):
        if time.time() > deadline:
            return
        loop(graphs, 1.0, 4)  # warm-up: kernels chosen, memory cached
        torch.manual_seed(0)
        seconds = timed(partial(loop, graphs, 1.0, args.decode_tokens), args.device)
        record[name] = {"ms_per_token": 1000 * seconds / args.decode_tokens, "loop_s": seconds, "load": load()}
    record["speedup"] = record.data["eager"]["ms_per_token"] / record.data["graphs"]["ms_per_token"]
    eager, graphed = (loop(graphs, 0.0, args.check_tokens) for graphs in (False, True))
    width = min(eager.shape[1], graphed.shape[1])
    record["greedy_rows_equal"] = (eager[:, :width] == graphed[:, :width]).all(1).float().mean().item()


@contextmanager
def transformers_layers():
    """rlx's training forward stepped aside, as it did for checkpointed layers before issue 51."""
    from rlx_cli.engine import decoder

    trains = decoder.trains
    decoder.trains = lambda lm: False
    try:
        yield
    finally:
        decoder.trains = trains


def forward_backward(scorer, batch, before: bool) -> None:
    """One micro-batch's forward and backward as the update runs it (``before``: transformers' layers)."""
    scorer.lm.zero_grad(set_to_none=True)
    with transformers_layers() if before else nullcontext():
        logp, _ = scorer(batch, 1.0)
        (-logp.mean()).backward()


def update_part(args, record: Record, deadline: float) -> None:
    import torch

    from rlx_cli.engine import decoder
    from rlx_cli.engine.batch import Rollout, position_ids
    from rlx_cli.engine.logprobs import Scorer
    from rlx_cli.engine.models import training_mode

    shape = args.shape or "1.5b"
    lm = rlx_train.qwen2(shape, args.device, torch.float32)
    params, width = sum(p.numel() for p in lm.parameters()), args.prompt_len + args.update_tokens
    rows = max(1, args.micro_batch_tokens // width)
    seeded = torch.Generator().manual_seed(0)
    ids = torch.randint(3, lm.config.vocab_size, (rows, width), generator=seeded).to(args.device)
    attention = torch.ones_like(ids)
    responses = ids[:, args.prompt_len :]
    mask = torch.ones(responses.shape, device=args.device)
    batch = Rollout(ids, attention, position_ids(attention), responses, mask, [""] * rows)
    tokens = rows * (width - 1)  # the forward runs every position but the last answer token
    flops = rlx_train.model_flops(params, rlx_train.QWEN25[shape], tokens, width - 1, lora=False)
    record["micro_batch"] = {"params": params, "rows": rows, "width": width, "tokens": tokens}
    compute = torch.bfloat16 if args.device == "cuda" else None
    for mode in args.modes:
        if time.time() > deadline:
            record[mode] = {"skipped": "the part's deadline"}
            continue
        training_mode(lm, checkpointing=mode != "own_compiled_kept")
        once = partial(forward_backward, Scorer(lm, compute, compiled="compiled" in mode), batch, mode == "before")
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            first = timed(once, args.device)
            seconds = statistics.median(timed(once, args.device) for _ in range(args.reps))
        except torch.cuda.OutOfMemoryError as error:
            lm.zero_grad(set_to_none=True)
            record[mode] = {"out_of_memory": str(error).splitlines()[0]}
            continue
        result = {"first_s": first, "s": seconds, "tokens_per_s": tokens / seconds, "tflops": flops / seconds / 1e12}
        result["load"] = load()
        result["own_forward"] = mode != "before" and decoder.trains(lm)
        if args.peak_tflops:
            result["mfu"] = result["tflops"] / args.peak_tflops
        if args.device == "cuda":
            result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        record[mode] = result


def train_part(args, record: Record, deadline: float, part: str) -> None:
    """``rlx train`` through ``rlx_train.run_one`` (a worker process of its own, stopped at ``deadline``)."""
    name, prompts = TRAIN_RUNS[part]
    settings = argparse.Namespace(**vars(args))
    settings.prompts, settings.profile = args.prompts or prompts, name if part == "step" else "none"
    settings.generate_rows = args.rows
    record[name] = rlx_train.run_one(name, settings, {}, deadline)


def overlap_part(args, record: Record, deadline: float) -> None:
    """The same lag-1 run sequential, then with the sampler process (``rollout.overlap``); their ``train/rollout_kl``
    step by step, side by side."""
    settings = argparse.Namespace(**vars(args))
    settings.prompts, settings.profile, settings.generate_rows = args.prompts or 64, "none", args.rows
    settings.new_tokens, models, names = args.overlap_tokens, {}, ("0.5b-grpo-full-lag1", "0.5b-grpo-full-overlap")
    for name in names:
        record[name] = rlx_train.run_one(name, settings, models, deadline)
    runs = [record.data[name].get("rollout_kl_each") or [] for name in names]
    record["rollout_kl_by_step"] = [{"sequential": a, "overlap": b} for a, b in zip(*runs)]


def trl_part(args, record: Record, deadline: float) -> None:
    """``vs_trl.py`` in a process of its own, its scratch under ``--work``; cut, its finished workers summarised."""
    scratch, out = Path(args.work) / "trl", Path(args.out) / "vs_trl.json"
    scratch.mkdir(parents=True, exist_ok=True)
    plan = ["--sizes", args.trl_size, "--finetunes", "full", "--stops", "natural", "--rollout", "fast"]
    command = [sys.executable, str(VS_TRL), *plan, "--device", args.device, "--precision", args.precision,
               "--checkpointing", "--rounds", "1", "--steps", "3", "--warmup", "1", "--new-tokens",
               str(args.trl_tokens), "--rlx-tracking", "none", "--rlx-set", *rlx_train.FAST,
               "--json", str(out)]  # fmt: skip
    record["command"] = " ".join(command[1:])
    env = {**os.environ, "TMPDIR": str(scratch)}  # vs_trl's scratch: where a cut run's workers left their files
    try:
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        done = run_group(command, max(1.0, deadline - time.time()), env=env, **pipes)
        record["returncode"], record["output_tail"] = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        record["cut"] = "stopped at the part's deadline"
        for left in sorted(scratch.glob("vs-trl-*")):
            collect = [sys.executable, str(VS_TRL), *plan, "--collect", str(left), "--json", str(out)]
            subprocess.run(collect, env=env, capture_output=True, text=True, timeout=120)
    if out.exists():
        record["vs_trl"] = json.loads(out.read_text())


def run_part(args) -> None:
    deadline = time.time() + args.part_s - 15  # leave the JSON written before the parent stops the part
    facts = rlx_train.device_facts(args.device)
    if args.peak_tflops is None:
        args.peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in facts["device"]), None)
    record = Record(Path(args.out) / f"speed_{args.part}.json", {**facts, "part": args.part, "settings": vars(args)})
    if args.part in TRAIN_RUNS:
        train_part(args, record, deadline, args.part)
    else:
        parts = {"decode": decode_part, "update": update_part, "trl": trl_part, "overlap": overlap_part}
        parts[args.part](args, record, deadline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["decode", "update"], choices=PARTS)
    parser.add_argument("--out", required=True, help="the parts' JSON files go here (on the device machine: $OUT)")
    parser.add_argument("--work", default="/tmp/rlx-speed", help="models and logs (not sent back)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shape", choices=list(rlx_train.QWEN25), help="every part at this shape (a smoke test)")
    parser.add_argument("--part-s", type=float, default=480, help="each part is stopped after this")
    parser.add_argument("--rows", type=int, default=256, help="decode rows (rollout.generate_rows in rlx train)")
    parser.add_argument("--group", type=int, default=4, help="answers per prompt")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, default=1024)
    parser.add_argument("--check-tokens", type=int, default=64, help="greedy tokens compared, eager against graphs")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--update-tokens", type=int, default=992, help="answer tokens of an update row")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="the update's forwards")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, help="the card's dense bf16 peak (default: by its name)")
    parser.add_argument("--prompts", type=int, help="rlx train's prompts a step (default: 64; lora7b 32)")
    parser.add_argument("--new-tokens", type=int, default=1024, help="rlx train's rollout.max_new_tokens")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--trl-size", default="1.5b", help="vs_trl.py --sizes")
    parser.add_argument("--trl-tokens", type=int, default=256, help="vs_trl.py --new-tokens")
    parser.add_argument("--overlap-tokens", type=int, default=256, help="the overlap part's rollout.max_new_tokens")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a part's own process
    args = parser.parse_args()
    if args.part:
        return run_part(args)
    for part in args.parts:
        started = time.perf_counter()
        try:
            done = run_group([sys.executable, __file__, *sys.argv[1:], "--part", part], args.part_s + 30)
            print(f"[{part}] exit {done.returncode} after {time.perf_counter() - started:.0f} s", flush=True)
        except subprocess.TimeoutExpired:
            print(f"[{part}] stopped after {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
