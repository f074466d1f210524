#!/usr/bin/env bash
# The off-policy study, second part: the two best arms of run.sh (by mean final eval/accuracy_sampled: GSPO, KL-Cov)
# with TIS (rollout_correction=tis), 5 seeds at +regime=off_policy, two samples stale (rollout.lag=2), two runs at a time, one thread each, seed-major. A finished run (metrics.json) is skipped.
set -u
# runs in the current directory: its MLflow store ./mlflow.db, the runs in ./runs/
python -c "import mlflow; mlflow.MlflowClient('sqlite:///mlflow.db').search_experiments()"  # the store, before parallel runs
COMMON="+regime=off_policy rollout=fast rollout.lag=2 trainer.threads=1 tracking.experiment=off-policy"
ARMS=(
  "gspo_tis|algo=gspo rollout_correction=tis"
  "kl_cov_tis|algo=grpo policy_loss=kl_cov rollout_correction=tis"
)
for seed in ${SEEDS:-0 1 2 3 4}; do
  for arm in "${ARMS[@]}"; do
    name=${arm%%|*}; overrides=${arm#*|}
    out=runs/$name-s$seed
    [ -f "$out/metrics.json" ] && continue
    echo "rlx train $overrides $COMMON seed=$seed trainer.output_dir=$out"
  done
done | xargs -P "${JOBS:-2}" -I{} bash -c '{} > /dev/null 2>&1 || echo "FAILED: {}"'
