#!/usr/bin/env bash
# The off-policy study (reports/off-policy.md): 8 arms x 5 seeds at +regime=off_policy as it was then (lr 5e-5, set
# below; the regime is now lr 2e-5: reports/off-policy-regime.md), the sampler two steps stale
# (rollout.lag=2), two runs at a time, one thread each, seed-major, by scripts/run_arms.sh in the current directory.
# Arguments, if any, replace the arms ("name|overrides" each): run-tis.sh passes its own.
ARMS=(
  "grpo|algo=grpo"
  "clip_higher|algo=grpo policy_loss.eps_high=0.28"
  "clip_cov|algo=grpo policy_loss=clip_cov"
  "kl_cov|algo=grpo policy_loss=kl_cov"
  "gspo|algo=gspo"
  "cispo|algo=cispo"
  "sapo|algo=sapo"
  "gmpo|algo=gmpo"
)
[ $# -gt 0 ] && ARMS=("$@")
COMMON="+regime=off_policy trainer.lr=5e-5 rollout=fast rollout.lag=2 trainer.threads=1 tracking.experiment=off-policy" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" "${ARMS[@]}"
