#!/usr/bin/env bash
# VAPO's ablation at the off-policy regime as it was then, lr 5e-5 (now 2e-5: reports/off-policy-regime.md)
# (reports/off-policy.md § VAPO's ingredients): the full preset and its 7 one-ingredient ablations x 5 seeds, two
# steps stale as the loss study, the critic started as a reward model
# fitted to the base's scores (unfinished answers -1), two runs at a time, in the current directory (./mlflow.db).
exec rlx ablate algo=vapo +regime=off_policy trainer.lr=5e-5 rollout.lag=2 critic.init=reward_model critic.unfinished_score=-1 \
  trainer.threads=1 --seeds 5 --jobs 2 --study vapo-off-policy
