#!/usr/bin/env bash
# The off-policy regime pilot (reports/off-policy-regime.md): GRPO on long_sums, 8 prompts x 8 answers a step, 20
# steps, at lr in {1e-5, 2e-5, 5e-5} x updates per rollout in {4, 16, 64} x rollout.lag in {0, 2}, seeds 0 and 1 (36
# runs), two at a time, one thread each, by scripts/run_arms.sh in the current directory. Updates per rollout:
# 4 = 1 epoch x 4 minibatches of 16 answers, 16 = 4 epochs x 4 of 16, 64 = 4 epochs x 16 of 4 (the old regime).
ARMS=()
for lr in 1e-5 2e-5 5e-5; do
  for updates in 4 16 64; do
    case $updates in 4) layout="trainer.epochs=1 trainer.minibatches=4" ;;
                     16) layout="trainer.epochs=4 trainer.minibatches=4" ;;
                     64) layout="trainer.epochs=4 trainer.minibatches=16" ;; esac
    for lag in 0 2; do
      ARMS+=("lr$lr-u$updates-lag$lag|algo=grpo $layout trainer.lr=$lr rollout.lag=$lag")
    done
  done
done
COMMON="task=long_sums rollout.prompts_per_step=8 trainer.steps=20 trainer.eval_every=10 trainer.threads=1 \
tracking.experiment=off-policy-regime" SEEDS="${SEEDS:-0 1}" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" "${ARMS[@]}"
