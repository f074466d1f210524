#!/usr/bin/env bash
# The staleness study (reports/staleness.md): GRPO with naive PPO under staleness (trainer.old_logp=sampler: the
# ratio against the stale sampler's own log-probs, no recompute; AReaL's "naive PPO", verl's bypass mode) against
# decoupled PPO (trainer.old_logp=trainer with rollout_correction=tis: the clip centred on the trainer's recomputed
# pi_old, times the truncated pi_old / pi_sampler weight; AReaL's decoupled PPO) at rollout.lag in {0, 1, 2, 4, 8},
# 5 seeds, at the default task (100 steps) or at +regime=off_policy (20 steps): the first argument. Two runs at a
# time, one thread each, seed-major, by scripts/run_arms.sh in the current directory; evaluation with 4 sampled
# answers a prompt at the first and last step.
where=${1:?default or regime}
case $where in
  default) SETTING="trainer.steps=100 trainer.eval_every=100" ;;
  regime) SETTING="+regime=off_policy trainer.eval_every=20" ;;
  *) echo "valid: default, regime" >&2; exit 2 ;;
esac
ARMS=()
for lag in 0 1 2 4 8; do
  ARMS+=("naive-lag$lag|algo=grpo rollout.lag=$lag trainer.old_logp=sampler")
  ARMS+=("decoupled-lag$lag|algo=grpo rollout.lag=$lag trainer.old_logp=trainer rollout_correction=tis")
done
COMMON="$SETTING eval.samples=4 trainer.threads=1 tracking.experiment=staleness-$where" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" "${ARMS[@]}"
