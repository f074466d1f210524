#!/usr/bin/env bash
# The reasoning-gym study (reports/gym-chain_sum.md): task=gym task.dataset=chain_sum, 6 arms x 5 seeds, 100 steps,
# an evaluation every 10, two runs at a time, one thread each, seed-major, by scripts/run_arms.sh in the current
# directory (./mlflow.db, ./runs/). The first argument picks the difficulty: easy (the default task.config, 2-3
# terms of one digit) or hard (2-3 terms of two digits).
set -u
case "${1:-}" in
  easy) CONFIG="" EXPERIMENT=gym-chain_sum ;;
  hard) CONFIG="'task.config={min_terms: 2, max_terms: 3, min_digits: 2, max_digits: 2}'" EXPERIMENT=gym-chain_sum-hard ;;
  *) echo "usage: run.sh easy|hard" >&2; exit 2 ;;
esac
COMMON="task=gym task.dataset=chain_sum $CONFIG trainer.steps=100 trainer.eval_every=10 trainer.threads=1 tracking.experiment=$EXPERIMENT" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" \
  "grpo|algo=grpo" "ppo|algo=ppo" "vapo|algo=vapo" "dapo|algo=dapo" "rft|algo=rft" "gspo|algo=gspo"
