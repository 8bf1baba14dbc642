#!/usr/bin/env bash
# Three steps of the whole loop on the GPU backend: trainer (verl's FSDP actor and reference, with
# collocated sglang), gateway, controller, calculator harnesses. Fails unless a step trained a
# positive number of tokens with a finite grad norm, the model version advanced, and calls were
# recorded under a version >= 1 (each sglang server is checked to report the version it was given).
# Stops everything it started (Ray, sglang, gateway, controller) on exit or interrupt.
#   GPU (pip install -e '.[gpu]', model in the Hugging Face cache or MODEL=/path):  bash bench/gpu_smoke.sh
#   The same script on the CPU, verl's workers feeding the embedded engine:  DEVICE=cpu bash bench/gpu_smoke.sh
# Extra arguments are agl train overrides. Last line: gpu_smoke_steps=3 trained_tokens=N versions=V calls_at_v1_plus=C ok=1
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-runs/gpu_smoke}
PORT=${PORT:-18000}
KEY=gpu-smoke-key
PY=$(command -v "${PYTHON:-python}")
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute (not resolved: a venv's): harnesses run elsewhere
rm -rf "$OUT" && mkdir -p "$OUT"
set -m  # each background job in its own process group: killed whole
pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  "$PY" -m ray.scripts.scripts stop --force > /dev/null 2>&1 || true  # Ray's workers and sglang servers
}
trap stop EXIT
trap 'exit 130' INT TERM

common=(
  agl.admin_key=$KEY agl.gateway=http://127.0.0.1:$PORT
  "agl.spec.harness.command=[$PY,$PWD/examples/calculator/harness.py]"
  agl.tasks=$PWD/examples/calculator/tasks.jsonl agl.val_tasks= agl.n=4 agl.batch_groups=2 agl.active_groups=3
  trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=0 trainer.logger=[tensorboard]
  trainer.default_local_dir=$OUT/train trainer.experiment_name=gpu-smoke actor_rollout_ref.actor.optim.lr_warmup_steps=0
)
if [ "$DEVICE" = cpu ]; then
  $PY -m agl.cli engine --model "${MODEL:-smollm2}" --port $((PORT + 1)) > "$OUT/engine.log" 2>&1 &
  pids+=($!)
  config=(examples/calculator/train.yaml agl.engine=http://127.0.0.1:$((PORT + 1)) agl.temperature=0.7)
  for _ in $(seq 300); do curl -sf http://127.0.0.1:$((PORT + 1))/health > /dev/null && break; sleep 1; done
else
  config=(examples/gpu/qwen3.5-9b-8gpu.yaml
    actor_rollout_ref.model.path=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct} actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.rollout.max_model_len=4096
    actor_rollout_ref.rollout.prompt_length=3072 actor_rollout_ref.rollout.response_length=1024
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 agl.max_length=8192 trainer.n_gpus_per_node=1)
fi

# 1. the trainer: starts Ray and verl's workers (on GPUs also the sglang replica), writes the engines' addresses
$PY -m agl.cli train "${config[@]}" "${common[@]}" "$@" > "$OUT/train.log" 2>&1 &
train=$!
pids+=($train)
# 2. the gateway on the engines' addresses, 3. the controller
for _ in $(seq 900); do [ -s "$OUT/train/engines.txt" ] && break; kill -0 $train || { tail -30 "$OUT/train.log"; exit 1; }; sleep 1; done
$PY -m agl.cli gateway --engine-url "$(cat "$OUT/train/engines.txt")" --port $PORT --admin-key $KEY \
  --db "sqlite:///$OUT/agl.db" > "$OUT/gateway.log" 2>&1 &
pids+=($!)
$PY -m agl.cli controller --gateway http://127.0.0.1:$PORT --admin-key $KEY --launcher local \
  --state-dir "$OUT/controller" > "$OUT/controller.log" 2>&1 &
pids+=($!)

wait $train || { tail -40 "$OUT/train.log"; exit 1; }
grep -a "^step " "$OUT/train.log" || true
$PY - "$OUT" <<'EOF'
import json, math, sys
from pathlib import Path
from agl.store import Store

out = Path(sys.argv[1])
steps = [h for h in map(json.loads, (out / "train" / "metrics.jsonl").read_text().splitlines()) if "reward/mean" in h]
trained = [s for s in steps if s.get("adapter/trained_tokens", 0) > 0 and "timing/update_s" in s]
with Store(f"sqlite:///{out / 'agl.db'}") as store:
    calls = [c for cs in store.calls_for([r.id for r in store.list_rollouts(limit=10_000)]).values() for c in cs]
    versions = [m.version for m in store.models()]
failures = []
if not trained:
    failures.append("no step trained a positive number of tokens")
if not all(math.isfinite(s["actor/grad_norm"]) for s in trained):
    failures.append(f"grad norms {[s.get('actor/grad_norm') for s in trained]}")
if max(versions, default=0) < 1:
    failures.append(f"the model version never advanced (registered: {versions})")
late = sum(c.model_version >= 1 for c in calls)
if not late:
    failures.append(f"no call was recorded under a version >= 1 ({len(calls)} calls)")
for f in failures:
    print("gpu_smoke: FAIL:", f)
tokens = sum(int(s["adapter/trained_tokens"]) for s in trained)
ok = int(not failures)
print(f"gpu_smoke_steps={len(steps)} trained_tokens={tokens} versions={max(versions, default=0)} calls_at_v1_plus={late} ok={ok}")
sys.exit(0 if ok else 1)
EOF
