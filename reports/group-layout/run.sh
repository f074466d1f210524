#!/usr/bin/env bash
# The group-layout control (reports/group-layout.md): GRPO and VAPO with 64 answers a step laid out as 8 prompts x 8
# answers, 16 x 4, 32 x 2 and 64 x 1, plus 64 x 1 drawn from a fixed pool of as many prompts as 8 x 8 sees over the
# run (task.pool), 5 seeds, at the default task (100 steps) or at +regime=off_policy (20 steps): the first argument,
# "default" or "regime". Two runs at a time, one thread each, seed-major, by scripts/run_arms.sh in the current
# directory; evaluation with 4 sampled answers a prompt at the first and last step.
where=${1:?default or regime}
case $where in
  default) SETTING="trainer.steps=100 trainer.eval_every=100"; POOL=800 ;;
  regime) SETTING="+regime=off_policy trainer.eval_every=20"; POOL=160 ;;
  *) echo "valid: default, regime" >&2; exit 2 ;;
esac
ARMS=()
for algo in grpo vapo; do
  for layout in 8x8 16x4 32x2 64x1; do
    ARMS+=("$algo-$layout|algo=$algo rollout.prompts_per_step=${layout%x*} rollout.group_size=${layout#*x}")
  done
  ARMS+=("$algo-64x1-pool|algo=$algo rollout.prompts_per_step=64 rollout.group_size=1 task.pool=$POOL")
done
COMMON="$SETTING eval.samples=4 trainer.threads=1 tracking.experiment=group-layout-$where" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" "${ARMS[@]}"
