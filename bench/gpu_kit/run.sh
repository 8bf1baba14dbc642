#!/usr/bin/env bash
# On the GPU machine, after install.sh: the tiny Qwen3 through agl's whole GPU path, one GPU.
#   bash bench/gpu_kit/run.sh [doctor|smoke|all]      (default all; the logs in $OUT)
# 1. random weights for the tiny model ($KIT/model; weights.py), once;
# 2. doctor: `agl doctor` on the 9B config with the tiny model and one GPU: versions skipped (the
#    bundle leaves flash-attn out on purpose), CUDA, Ray and verl's workers with verl's own sglang
#    server, /v1/models, one /generate, one collocated weight push;
# 3. smoke: bench/gpu_smoke.sh with the same model: three training steps of the whole loop
#    (trainer, gateway, controller, calculator harnesses); its last line says ok=1 or not.
# Both run with SDPA attention in the actor and sglang's triton attention and pytorch sampling,
# without CUDA graphs (TINY below): what the bundle carries. It stops what it started (Ray with
# `ray stop --force`: run it where nothing else uses Ray) and writes only under $KIT and $OUT:
# gpu.txt, doctor.log, smoke.log, smoke-{train,gateway,controller}.log and ray-logs.tgz (Ray's
# session logs, the sglang servers' among them). Last line: `gpu_kit_doctor=RC gpu_kit_smoke=RC`.
set -uo pipefail
cd "$(dirname "$0")/../.."
KIT=${KIT:-$PWD/.gpu-bundle/kit}  # ignored by git: kept between calls on the GPU machine
LOGS=${OUT:-$KIT/out}  # what comes back: the logs, and Ray's (with sglang's) packed
WORK=$KIT/work         # the runs' own folders: checkpoints, databases
STEP=${1:-all}
mkdir -p "$LOGS"
if [ ! -f "$KIT/env.sh" ]; then  # a machine idle past its warm time is given back, and a new one is bare
  echo "gpu-kit: no $KIT/env.sh: install.sh has not run on this machine (carry both parts again)"
  exit 1
fi
# shellcheck disable=SC1091
. "$KIT/env.sh"
export PYTHON=${PYTHON:-python3}
TINY=(
  actor_rollout_ref.model.override_config.attn_implementation=sdpa   # no flash-attn in the bundle
  +actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton   # no FA3, no flashinfer
  +actor_rollout_ref.rollout.engine_kwargs.sglang.sampling_backend=pytorch
  actor_rollout_ref.rollout.enforce_eager=true   # no CUDA graphs: a first run, and a quicker start
)
ONE_GPU=(  # what bench/gpu_smoke.sh sets for one GPU, for the doctor
  actor_rollout_ref.model.path=$KIT/model actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.rollout.max_model_len=4096
  actor_rollout_ref.rollout.prompt_length=3072 actor_rollout_ref.rollout.response_length=1024
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 agl.max_length=8192 trainer.n_gpus_per_node=1
)
rm -rf "$WORK" && mkdir -p "$WORK" "$LOGS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
"$PYTHON" -m bench.gpu_kit.weights "$KIT/model" || exit 1
doctor=skipped
smoke=skipped
if [ "$STEP" = doctor ] || [ "$STEP" = all ]; then
  timeout "${DOCTOR_S:-420}" "$PYTHON" -m agl.cli doctor --skip-versions \
    examples/gpu/qwen3.5-9b-8gpu.yaml "${ONE_GPU[@]}" "${TINY[@]}" agl.admin_key=k \
    "trainer.default_local_dir=$WORK/doctor" > "$LOGS/doctor.log" 2>&1
  doctor=$?
  sed -n '/^check  /,$p' "$LOGS/doctor.log"
  "$PYTHON" -m ray.scripts.scripts stop --force > /dev/null 2>&1 || true
fi
if [ "$STEP" = smoke ] || [ "$STEP" = all ]; then
  MODEL=$KIT/model OUT=$WORK/smoke timeout "${SMOKE_S:-540}" bash bench/gpu_smoke.sh "${TINY[@]}" \
    > "$LOGS/smoke.log" 2>&1
  smoke=$?
  tail -5 "$LOGS/smoke.log"
  for log in train gateway controller; do  # $OUT brings back 8 files of <= 16 MiB, 2 folders deep
    tail -c 15M "$WORK/smoke/$log.log" > "$LOGS/smoke-$log.log" 2>/dev/null
  done
fi
tar czf "$LOGS/ray-logs.tgz" -C /tmp/ray --wildcards 'session_2*/logs' 2>/dev/null  # verl's sglang servers
echo "gpu_kit_doctor=$doctor gpu_kit_smoke=$smoke"
