#!/bin/sh
# Builds examples/autogen_math/.venv, the agent's own environment: AutoGen 0.7 pins protobuf~=5.29, and agl's
# .venv has TensorBoard's protobuf 6, so the agent runs as a deployed harness would, from a venv of its own.
#   sh examples/autogen_math/venv.sh        (UV: the uv to use, default agl's .venv/bin/uv, else uv on PATH;
#                                           PYTHON: the interpreter or version, default 3.11)
# Rebuilds from scratch; `.venv/.installed` marks a finished build (tests/examples/test_autogen_math.py builds
# the venv when it is missing). Needs PyPI.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
uv=${UV:-$here/../../.venv/bin/uv}
[ -x "$uv" ] || uv=uv
"$uv" venv --clear --quiet --no-python-downloads --python "${PYTHON:-3.11}" "$here/.venv"
"$uv" pip install --quiet --python "$here/.venv/bin/python" "autogen-agentchat>=0.7,<0.8" "autogen-ext[openai]>=0.7,<0.8"
touch "$here/.venv/.installed"
