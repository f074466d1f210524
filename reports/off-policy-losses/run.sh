#!/usr/bin/env bash
# The off-policy loss study at the regime its pilot chose (reports/off-policy-losses.md; the regime:
# reports/off-policy-regime.md): 14 arms x 5 seeds at +regime=off_policy, evaluated at steps 0 and 20 with 4 sampled
# answers a prompt, two runs at a time, one thread each, seed-major, by scripts/run_arms.sh in the current directory.
# Lag 0: the eight losses, and TIS on GRPO and on CISPO (a control: at lag 0 the sampler is the trainer). Lag 2 (the
# sampler two steps, 128 optimizer updates, behind): GRPO and CISPO with and without TIS.
ARMS=(
  "grpo|algo=grpo"
  "clip_higher|algo=grpo policy_loss.eps_high=0.28"
  "clip_cov|algo=grpo policy_loss=clip_cov"
  "kl_cov|algo=grpo policy_loss=kl_cov"
  "gspo|algo=gspo"
  "cispo|algo=cispo"
  "sapo|algo=sapo"
  "gmpo|algo=gmpo"
  "grpo_tis|algo=grpo rollout_correction=tis"
  "cispo_tis|algo=cispo rollout_correction=tis"
  "grpo_lag2|algo=grpo rollout.lag=2"
  "cispo_lag2|algo=cispo rollout.lag=2"
  "grpo_tis_lag2|algo=grpo rollout.lag=2 rollout_correction=tis"
  "cispo_tis_lag2|algo=cispo rollout.lag=2 rollout_correction=tis"
)
[ $# -gt 0 ] && ARMS=("$@")
COMMON="+regime=off_policy eval.samples=4 trainer.eval_every=20 trainer.threads=1 tracking.experiment=off-policy-losses" \
  exec bash "$(dirname "$0")/../../scripts/run_arms.sh" "${ARMS[@]}"
