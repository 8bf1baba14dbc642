#!/usr/bin/env bash
# On the GPU machine: join the bundle's parts carried into .gpu-bundle/ (checked against their
# SHA256SUMS), unpack them into $KIT (default .gpu-bundle/kit), install the wheels into $KIT/site with
# `pip install --no-index --no-deps --target`, add the flashinfer stub, and write $KIT/env.sh,
# which run.sh sources: PYTHONPATH (this checkout, then $KIT/site), PATH ($KIT/site/bin, where the
# `agl` command lies) and sglang's switches for a machine without flashinfer.
#   bash bench/gpu_kit/install.sh                      # on the GPU machine, with its python3
#   PYTHON=... KIT=... bash bench/gpu_kit/install.sh   # check_venv.sh, on a CPU stand-in
# It replaces an earlier install in $KIT. It downloads nothing, changes
# nothing outside $KIT and never touches the machine's own packages (torch, transformers, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
KIT=${KIT:-$PWD/.gpu-bundle/kit}  # ignored by git: kept between calls on the GPU machine
mkdir -p "$KIT"
rm -rf "$KIT/site" "$KIT/wheels" "$KIT/model"
t=$(date +%s)
"$PY" -m bench.gpu_kit.parts join .gpu-bundle "$KIT/bundle.tar.gz"
tar xzf "$KIT/bundle.tar.gz" -C "$KIT"
rm "$KIT/bundle.tar.gz"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$KIT/site" "$KIT"/wheels/*.whl
cp -r bench/gpu_kit/flashinfer_stub/flashinfer "$KIT/site/"
cat > "$KIT/env.sh" <<ENV
export PYTHONPATH=$PWD:$KIT/site PATH=$KIT/site/bin:\$PATH GPU_KIT_SITE=$KIT/site
export SGLANG_IS_FLASHINFER_AVAILABLE=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
ENV
# shellcheck disable=SC1091
(. "$KIT/env.sh" && "$PY" -m bench.gpu_kit.check --versions) || echo "gpu-kit: a requirement does not hold (above)"
echo "gpu_kit_install_s=$(($(date +%s) - t)) wheels=$(ls "$KIT"/wheels/*.whl | wc -l) site=$KIT/site"
