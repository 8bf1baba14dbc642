#!/usr/bin/env bash
# A few steps of the whole loop on one GPU with a small model: trainer (verl FSDP actor + collocated
# sglang replica), gateway, controller, calculator harnesses. Needs `pip install -e '.[train,gpu]'`
# and the model in the Hugging Face cache (or MODEL=/path). Prints the per-step lines and exits 0
# when every step ran. Usage: bash bench/gpu_smoke.sh [extra agl train overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
OUT=${OUT:-runs/gpu_smoke}
PORT=${PORT:-18000}
KEY=gpu-smoke-key
PY=${PYTHON:-python}
rm -rf "$OUT" && mkdir -p "$OUT"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

# 1. the trainer: starts Ray, the FSDP actor and the sglang replica, writes their addresses, waits for the gateway
$PY -m agl.cli train examples/gpu/qwen3.5-9b-8gpu.yaml \
  agl.admin_key=$KEY agl.gateway=http://127.0.0.1:$PORT \
  "agl.spec.harness.command=[$PY,$PWD/examples/calculator/harness.py]" \
  agl.tasks=$PWD/examples/calculator/tasks.jsonl agl.val_tasks= \
  agl.n=4 agl.batch_groups=2 agl.active_groups=3 \
  actor_rollout_ref.model.path=$MODEL actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.rollout.max_model_len=4096 \
  actor_rollout_ref.rollout.prompt_length=3072 actor_rollout_ref.rollout.response_length=1024 \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 actor_rollout_ref.actor.optim.lr=1e-6 \
  trainer.n_gpus_per_node=1 trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=0 \
  trainer.default_local_dir=$OUT/train trainer.logger=[console] trainer.experiment_name=gpu-smoke "$@" \
  > >(tee "$OUT/train.log") 2>&1 &
train=$!
pids+=($train)

# 2. the gateway on the replica's address, 3. the controller
for _ in $(seq 900); do [ -s "$OUT/train/engines.txt" ] && break; kill -0 $train || exit 1; sleep 1; done
$PY -m agl.cli gateway --engine-url "$(cat "$OUT/train/engines.txt")" --port $PORT --admin-key $KEY \
  --db "sqlite:///$OUT/agl.db" > "$OUT/gateway.log" 2>&1 &
pids+=($!)
$PY -m agl.cli controller --gateway http://127.0.0.1:$PORT --admin-key $KEY --launcher local \
  --state-dir "$OUT/controller" > "$OUT/controller.log" 2>&1 &
pids+=($!)

wait $train
grep -a "^step 3:" "$OUT/train.log" > /dev/null
echo "gpu_smoke_steps=3 ok=1"
