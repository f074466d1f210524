#!/usr/bin/env bash
# The gym pilot (reports/gym-chain_sum.md, "Pilot"): GRPO on task=gym task.dataset=chain_sum at both difficulties x
# three update settings, the study's budget (100 steps of 16 prompts x 8 answers, 12,800 samples), evaluated every 20
# steps with 4 sampled answers a prompt, seeds 0 and 1 (12 runs), two at a time, one thread each, by
# scripts/run_arms.sh in the current directory. Updates per rollout: 2 = the shipped 1 epoch x 2 minibatches at lr
# 1e-5; 16 = 1 epoch x 16 minibatches of 8 answers at lr 2e-5 (the same compute); 64 = 4 epochs x 16 at lr 2e-5, the
# step of +regime=off_policy (reports/off-policy-regime.md). With the argument "levels", the second stage instead:
# reasoning-gym's curriculum levels level00 (2 terms of 1 digit) and level11 (2-3 terms of 1-2 digits), each with its
# own base, at 16 and 64 updates per rollout (8 runs). With "long", the third stage: the easy half at 64 updates per
# rollout for twice the budget (200 steps, 25,600 samples), its own experiment gym-pilot-long (2 runs).
config() {
  case $1 in
    easy) echo "" ;;
    hard) echo "'task.config={min_terms: 2, max_terms: 3, min_digits: 2, max_digits: 2}'" ;;
    level00) echo "'task.config={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}'" ;;
    level11) echo "'task.config={min_terms: 2, max_terms: 3, min_digits: 1, max_digits: 2}'" ;;
  esac
}
ARMS=()
STEPS=100 EXPERIMENT=gym-pilot
case "${1:-}" in
  levels) DIFFICULTIES="level00 level11" UPDATES="16 64" ;;
  long) DIFFICULTIES=easy UPDATES=64 STEPS=200 EXPERIMENT=gym-pilot-long ;;
  *) DIFFICULTIES="easy hard" UPDATES="2 16 64" ;;
esac
for difficulty in $DIFFICULTIES; do
  for updates in $UPDATES; do
    case $updates in 2) layout="" ;;
                     16) layout="trainer.epochs=1 trainer.minibatches=16 trainer.lr=2e-5" ;;
                     64) layout="trainer.epochs=4 trainer.minibatches=16 trainer.lr=2e-5" ;; esac
    ARMS+=("$difficulty-u$updates|algo=grpo $(config $difficulty) $layout")
  done
done
COMMON="task=gym task.dataset=chain_sum trainer.steps=$STEPS trainer.eval_every=20 eval.samples=4 trainer.threads=1 \
tracking.experiment=$EXPERIMENT" SEEDS="${SEEDS:-0 1}" \
  exec bash "$(dirname "$0")/../../../scripts/run_arms.sh" "${ARMS[@]}"
