#!/usr/bin/env bash
# A short algo=vapo in bf16 on one GPU, on a ~0.48B Llama built from config (hidden 1280, 24 layers; the
# character tokenizer; a few SFT steps, so the weights are close to random): full fine-tuning and LoRA with HF
# rollouts, then rollout=vllm when vLLM imports. Prints each run's step time, tokens/s and peak GPU memory.
#
#   bash scripts/gpu_smoke.sh                 # on a GPU machine, after the README's set-up
#   DEVICE=cpu SIZE=tiny STEPS=2 bash scripts/gpu_smoke.sh    # the same runs on the CPU, in a minute
set -euo pipefail
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-0.5b}
STEPS=${STEPS:-10}
OUT_DIR=${OUT_DIR:-outputs/gpu_smoke}
export HF_HUB_OFFLINE=1 RLX_HOME=${RLX_HOME:-$OUT_DIR/rlx_home}

case $SIZE in
  0.5b) arch=(model.arch.hidden_size=1280 model.arch.intermediate_size=3456 model.arch.num_hidden_layers=24
              model.arch.num_attention_heads=20 model.arch.num_key_value_heads=20 model.arch.head_dim=64
              model.sft.steps=50 model.dtype=bfloat16) ;;
  tiny) arch=(model.sft.steps=20 model.dtype=float32) ;;
  *) echo "SIZE=$SIZE: valid choices: 0.5b, tiny" >&2; exit 2 ;;
esac
common=(algo=vapo "${arch[@]}" trainer.device="$DEVICE" trainer.steps="$STEPS" trainer.eval_every=0
        value_pretrain.steps=5 task.eval_size=64 tracking=none)

run() {  # name, extra overrides...
  local name=$1 dir=$OUT_DIR/$1
  shift
  local start=$SECONDS
  rlx train "${common[@]}" trainer.output_dir="$dir" "$@"
  python3 - "$name" "$dir/metrics.json" "$((SECONDS - start))" <<'EOF'
import json, sys
name, path, wall = sys.argv[1], sys.argv[2], sys.argv[3]
m = json.load(open(path))
keys = ["eval/accuracy", "perf/step_s", "perf/generate_s", "perf/tokens_per_s", "perf/gpu_peak_gib", "rollout/logp_gap"]
print(f"SMOKE {name}: wall {wall} s, " + ", ".join(f"{k} {m[k]:.4g}" for k in keys if k in m))
EOF
}

run hf-full model.finetune=full
run hf-lora model.finetune=lora
if python3 -c "import vllm" 2>/dev/null; then
  run vllm-full model.finetune=full rollout=vllm
else
  echo "SMOKE vllm: skipped, vLLM is not installed (pip install -e '.[vllm]')"
fi
