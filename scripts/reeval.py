"""Re-score the final policies of a study's FINISHED runs with more samples, and log the result into each run.

A run's own ``eval/accuracy_sampled`` draws one sample per held-out prompt: with 500 prompts at accuracy 0.89
its binomial noise is sqrt(0.89 · 0.11 / 500) = 0.014, as large as the seed-to-seed spread of a study. This
draws ``--samples`` per prompt (temperature as trained, a fixed seed) from each run's ``final/`` policy and logs
``eval/accuracy_sampled_x<K>`` at the run's last step, so that ``rlx report --metric`` tabulates it.

    MLFLOW_TRACKING_URI=sqlite:///mlflow.db python scripts/reeval.py --study long-sums --samples 8
    rlx report --study long-sums --metric eval/accuracy_sampled_x8 --stats

Run it from the directory the sweep ran in (``trainer.output_dir`` is relative to it). The presets' runs go
first, then the ablations'; a run that already has the metric is skipped, so a stopped pass resumes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tqdm import tqdm

from rlx_cli.config.compose import compose
from rlx_cli.engine.models import load_pretrained
from rlx_cli.loops.build import build_task
from rlx_cli.sampling.rollout import HFSampler
from rlx_cli.studies.runs import connect, load_runs


def sampled_accuracy(path: Path, cfg, samples: int, seed: int, batch: int) -> float:
    """Mean score of ``samples`` sampled responses per held-out prompt of ``cfg.task`` -> accuracy."""
    model, tokenizer = load_pretrained(path, cfg.model, torch.float32)  # the CPU's float32, as the runs trained
    model.eval()
    task, sampler = build_task(cfg.task), HFSampler(tokenizer, top_p=cfg.rollout.top_p)
    problems = [p for p in task.eval_problems for _ in range(samples)]
    torch.manual_seed(seed)
    correct = 0.0
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        out = sampler.generate(
            model,
            [p.prompt for p in chunk],
            temperature=cfg.rollout.temperature,
            max_new_tokens=cfg.rollout.max_new_tokens,
        )
        correct += sum(task.score_batch(out.texts, chunk))
    return correct / len(problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--samples", type=int, default=8, help="samples per held-out prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--redo", action="store_true", help="re-score runs that already have the metric")
    args = parser.parse_args()
    _, client = connect()
    key = f"eval/accuracy_sampled_x{args.samples}"
    runs = sorted(load_runs(None, args.study), key=lambda r: r.data.tags.get("rlx.ablate", "none") != "none")
    for run in tqdm(runs, desc=f"{key} of study {args.study}"):
        if key in run.data.metrics and not args.redo:
            continue
        cfg = compose(run.data.tags["rlx.overrides"].split())
        final = Path(cfg.trainer.output_dir) / "final"
        if not (final / "config.json").is_file():
            raise SystemExit(f"run {run.info.run_id}: no final policy at {final} (run this where the sweep ran)")
        accuracy = sampled_accuracy(final, cfg, args.samples, args.seed, args.batch)
        client.log_metric(run.info.run_id, key, accuracy, step=int(cfg.trainer.steps))
        tqdm.write(f"{run.data.tags['rlx.overrides']}: {key} {accuracy:.4f}")


if __name__ == "__main__":
    main()
