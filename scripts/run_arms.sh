#!/usr/bin/env bash
# A study's runs: every arm ("name|overrides", the arguments) x every seed ($SEEDS, default 0-4), as
# `rlx train OVERRIDES $COMMON seed=S trainer.output_dir=runs/NAME-sS`, $JOBS at a time (default 2), seed-major,
# in the current directory (its MLflow store ./mlflow.db, the runs in ./runs/). A finished run (metrics.json) is
# skipped, so running it again finishes what is missing; a failed one prints "FAILED: <its line>".
set -u
python -c "import mlflow; mlflow.MlflowClient('sqlite:///mlflow.db').search_experiments()"  # the store, before parallel runs
for seed in ${SEEDS:-0 1 2 3 4}; do
  for arm in "$@"; do
    name=${arm%%|*}; overrides=${arm#*|}
    out=runs/$name-s$seed
    [ -f "$out/metrics.json" ] && continue
    echo "rlx train $overrides $COMMON seed=$seed trainer.output_dir=$out"
  done
done | xargs -d '\n' -P "${JOBS:-2}" -I{} bash -c '{} > /dev/null 2>&1 || echo "FAILED: {}"'
