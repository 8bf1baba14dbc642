#!/usr/bin/env bash
# `make gpu-bundle-check`: a CPU stand-in for the GPU machine, the bundle installed into it as the
# GPU machine installs it, the import check (check.py --ray) and agl doctor's CPU path in it.
# 1. A Python 3.12 venv, $GPU_KIT_CACHE/venv312, holding machine.txt only (what the GPU machine
#    has). Its torch 2.11.0 is PyPI's CUDA build (507 MB): PyPI has no CPU build of it for Python
#    3.12. It imports without a GPU, but needs the nvidia-* libraries: each comes from a wheel of
#    the same name in $NVIDIA_WHEELS (any version; default /opt/pypi-more/files, where such a
#    folder exists) or else from PyPI at machine.txt's pin (about 3 GB in all). Made again when
#    machine.txt changes.
# 2. install.sh from the parts in .gpu-bundle/ (make gpu-bundle) into $GPU_KIT_CACHE/check-kit.
# 3. check.py --ray with the venv's Python and the kit's env.sh;
# 4. cpu_doctor.py: `agl doctor` on the CPU path, Ray and verl's workers running from the bundle
#    with the tiny Qwen3, against the tests' sglang stand-in (its log: $GPU_KIT_CACHE/cpu-doctor.log).
# It needs python3.12 (PY312=...) and, for step 1, PyPI. It runs nothing on a GPU: sgl_kernel's
# CUDA kernels, and what only loads on a GPU, are left to the GPU machine (check.py says which).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${GPU_KIT_CACHE:-/tmp/gpukit-cache}
VENV=$CACHE/venv312
NVIDIA_WHEELS=${NVIDIA_WHEELS:-/opt/pypi-more/files}
PY312=${PY312:-python3.12}
if ! "$PY312" --version > /dev/null 2>&1 && command -v pyenv > /dev/null; then  # pyenv's, not on PATH
  PY312="$(pyenv root)/versions/$(pyenv versions --bare | grep '^3\.12' | tail -1)/bin/python3.12"
fi
mkdir -p "$CACHE"
if ! cmp -s bench/gpu_kit/machine.txt "$VENV/.machine"; then  # made again when machine.txt changes
  rm -rf "$VENV"
  "$PY312" -m venv "$VENV"
  grep -v '^#' bench/gpu_kit/machine.txt | grep -v '^nvidia-' > "$CACHE/machine-install.txt"
  for pin in $(grep '^nvidia-' bench/gpu_kit/machine.txt); do
    name=${pin%%==*}
    here=$(find "$NVIDIA_WHEELS" -maxdepth 1 -name "${name//-/_}-*.whl" 2>/dev/null | sort | tail -1)
    echo "${here:-$pin}" >> "$CACHE/machine-install.txt"
  done
  "$VENV/bin/python" -m pip install -q --no-deps -r "$CACHE/machine-install.txt"
  cp bench/gpu_kit/machine.txt "$VENV/.machine"
fi
PYTHON=$VENV/bin/python KIT=$CACHE/check-kit bash bench/gpu_kit/install.sh
# shellcheck disable=SC1091
. "$CACHE/check-kit/env.sh"
status=0
"$VENV/bin/python" -m bench.gpu_kit.check --ray || status=1
"$VENV/bin/python" -m bench.gpu_kit.weights "$CACHE/check-kit/model" > /dev/null
"$VENV/bin/python" -m bench.gpu_kit.cpu_doctor "$CACHE/check-kit/model" "$CACHE/check-kit/work" \
  > "$CACHE/cpu-doctor.log" 2>&1 || status=1
sed -n '/^check  /,$p' "$CACHE/cpu-doctor.log"
exit $status
