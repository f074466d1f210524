#!/usr/bin/env bash
# The entropy family at equal compute (reports/entropy.md, "At equal samples"): 5 arms x 5 seeds on task=long_sums,
# 100 steps, evaluated every 10, by scripts/run_arms.sh in the current directory (two runs at a time, one thread each).
COMMON="task=long_sums trainer.steps=100 trainer.eval_every=10 trainer.threads=1 tracking.experiment=entropy-compute" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" \
  "grpo|algo=grpo" "dapo|algo=dapo" "clip_cov|algo=clip_cov" "kl_cov|algo=kl_cov" "forking_tokens|algo=forking_tokens"
