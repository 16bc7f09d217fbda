# EmbedLab: the two commands are `make run` and `make test`; both start with `make setup`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
HELPERS_SRC := $(shell find helpers/csrc helpers/embedlab -type f \( -name '*.cc' -o -name '*.cu' -o -name '*.h' -o -name '*.py' -o -name '*.in' \) 2>/dev/null) helpers/CMakeLists.txt helpers/pyproject.toml
# Keep TensorFlow's start-up chatter out of test and notebook output.
export TF_CPP_MIN_LOG_LEVEL ?= 2
# CUDA kernels: AUTO (on when nvcc is found), ON or OFF; read by helpers/pyproject.toml.
export EMBEDLAB_CUDA ?= AUTO
# CPU kernels: AUTO (AVX2 when this machine has it), AVX2 or BASELINE; read by helpers/pyproject.toml.
export EMBEDLAB_CPU_ISA ?= AUTO

.PHONY: help setup run test test-py test-nb lab bench clean
help:
	@echo "make setup  create .venv, install requirements.txt, build and install helpers/ (idempotent)"
	@echo "make run    setup, then execute every notebook into build/notebooks (EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-small})"
	@echo "make test   setup, then pytest helpers/ and nbval on every notebook (EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-ci})"
	@echo "make lab    setup, then JupyterLab on 127.0.0.1 with token auth"
	@echo "make bench  setup, then the benchmark scripts in helpers/benchmarks"

setup: $(VENV)/.requirements $(VENV)/.embedlab

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.requirements: requirements.txt | $(VENV)/bin/python
	$(PIP) install -q -r requirements.txt
	touch $@

# Built against the TensorFlow installed above (--no-build-isolation). Rebuilt when any source
# of helpers/ changes; CMake's own build folder (helpers/build) keeps the rebuild incremental.
$(VENV)/.embedlab: $(VENV)/.requirements $(HELPERS_SRC)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PIP) install -q --no-build-isolation --no-deps --force-reinstall ./helpers
	$(PY) -c "import embedlab, json; print('embedlab build:', json.dumps(embedlab.build_info()))"
	touch $@

run: setup
	mkdir -p build/notebooks
	export EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-small}; \
	for nb in $(NOTEBOOKS); do \
	  echo "== $$nb (EMBEDLAB_SCALE=$$EMBEDLAB_SCALE)"; \
	  $(PY) -m jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=3600 \
	    --output-dir build/notebooks "$$nb"; \
	done
	@echo "Executed notebooks (with their figures) are in build/notebooks/"

test: setup test-py test-nb

test-py:
	export EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-ci}; $(PY) -m pytest helpers/tests -q -rs

test-nb:
	export EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-ci}; $(PY) -m pytest --nbval-lax -q -p no:cacheprovider $(NOTEBOOKS)

lab: setup
	$(PY) -m jupyter lab --ip=127.0.0.1 --no-browser --ServerApp.root_dir=$(CURDIR)

# CPU benchmarks always; the GPU one where PyTorch sees a CUDA device (it compares with PyTorch).
bench: setup
	$(PY) helpers/benchmarks/lookup_cpu.py
	$(PY) helpers/benchmarks/loader.py
	if $(PY) -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then \
	  $(PY) helpers/benchmarks/lookup_gpu.py; \
	else echo "lookup_gpu.py skipped: no PyTorch with a CUDA device in $(VENV) (see its docstring)"; fi

# Serve notebook 05's export with tritonserver on 127.0.0.1 (HTTP 8000, gRPC 8001, metrics 8002)
# until Ctrl-C; run notebook 05 (the export) first. Options: $(PY) -m embedlab.serving --help
.PHONY: serve
serve: setup
	$(PY) -m embedlab.serving

clean:
	rm -rf build helpers/build $(VENV)/.embedlab
