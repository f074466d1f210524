#!/usr/bin/env bash
# VAPO's ablation at the off-policy regime (reports/off-policy.md § VAPO's ingredients): the full preset and its 7
# one-ingredient ablations x 5 seeds, two samples stale as the loss study, the critic started as a reward model
# fitted to the base's scores (unfinished answers -1), two runs at a time, in the current directory (./mlflow.db).
exec rlx ablate algo=vapo +regime=off_policy rollout.lag=2 critic.init=reward_model critic.unfinished_score=-1 \
  trainer.threads=1 --seeds 5 --jobs 2 --study vapo-off-policy
