#!/usr/bin/env bash
# DAPO's sample accounting (reports/dapo-accounting.md): the entropy study's DAPO arm (task=long_sums, 100 steps) with
# and without rollout.carry_surplus (informative groups past the batch wait for the next step instead of being thrown
# away), and GRPO run on to 185 steps (23,680 samples, DAPO's budget there), 5 seeds, evaluated every 10 steps with 4
# sampled answers a prompt, by scripts/run_arms.sh in the current directory (two runs at a time, one thread each).
COMMON="task=long_sums trainer.eval_every=10 eval.samples=4 trainer.threads=1 tracking.experiment=dapo-accounting" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" \
  "dapo|algo=dapo trainer.steps=100" "dapo_carry|algo=dapo trainer.steps=100 rollout.carry_surplus=true" \
  "grpo|algo=grpo trainer.steps=185"
