#!/usr/bin/env bash
# The off-policy study (reports/off-policy.md): 8 arms x 5 seeds at +regime=off_policy, two samples stale
# (rollout.lag=2), two runs at a time, one thread each, seed-major. A finished run (metrics.json) is skipped.
# Arguments, if any, replace the arms ("name|overrides" each): run-tis.sh passes its own.
set -u
# runs in the current directory: its MLflow store ./mlflow.db, the runs in ./runs/
python -c "import mlflow; mlflow.MlflowClient('sqlite:///mlflow.db').search_experiments()"  # the store, before parallel runs
COMMON="+regime=off_policy rollout=fast rollout.lag=2 trainer.threads=1 tracking.experiment=off-policy"
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
for seed in ${SEEDS:-0 1 2 3 4}; do
  for arm in "${ARMS[@]}"; do
    name=${arm%%|*}; overrides=${arm#*|}
    out=runs/$name-s$seed
    [ -f "$out/metrics.json" ] && continue
    echo "rlx train $overrides $COMMON seed=$seed trainer.output_dir=$out"
  done
done | xargs -P "${JOBS:-2}" -I{} bash -c '{} > /dev/null 2>&1 || echo "FAILED: {}"'
