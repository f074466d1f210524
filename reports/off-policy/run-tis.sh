#!/usr/bin/env bash
# The off-policy study, second part: the two best arms of run.sh (by mean final eval/accuracy_sampled: GSPO, KL-Cov)
# with TIS (rollout_correction=tis), by run.sh's loop: 5 seeds, two runs at a time, in the current directory.
exec bash "$(dirname "$0")/run.sh" \
  "gspo_tis|algo=gspo rollout_correction=tis" \
  "kl_cov_tis|algo=grpo policy_loss=kl_cov rollout_correction=tis"
