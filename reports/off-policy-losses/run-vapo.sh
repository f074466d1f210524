#!/usr/bin/env bash
# VAPO's ablation at the regime the pilot chose (reports/off-policy-losses.md § VAPO's ingredients): the full preset
# and its 7 one-ingredient ablations x 5 seeds at +regime=off_policy (lag 0), evaluated at steps 0 and 20 with 4
# sampled answers a prompt, the critic started as a reward model fitted to the base's scores (unfinished answers -1),
# two runs at a time, one thread each, in the current directory (./mlflow.db).
exec rlx ablate algo=vapo +regime=off_policy critic.init=reward_model critic.unfinished_score=-1 eval.samples=4 \
  trainer.eval_every=20 trainer.threads=1 --seeds 5 --jobs 2 --study vapo-regime "$@"
