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
# CUDA kernels: AUTO (built when nvcc is found AND they can run here: a GPU is visible or
# TensorFlow is a CUDA build), ON (always, fails without nvcc) or OFF; read by helpers/pyproject.toml.
export EMBEDLAB_CUDA ?= AUTO
# CPU kernels: AUTO (baseline + AVX2 on x86-64, picked at load time) or BASELINE; read by helpers/pyproject.toml.
export EMBEDLAB_CPU_ISA ?= AUTO
# JupyterLab's address (make lab). The Docker images set 0.0.0.0 and publish the port on the
# host's loopback only.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
# The lab's working copies of the notebooks go to $(LAB_DIR)/notebooks (git-ignored): the lab never
# changes notebooks/ (ci/lab.sh).
LAB_DIR ?= build/lab

.PHONY: help setup run test test-py test-nb lab lab-test docker-test bench bench-peers docs clean FORCE
help:
	@echo "make setup  create .venv, install requirements.txt, build and install helpers/ (idempotent)"
	@echo "make run    setup, then execute every notebook into build/notebooks (EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-small})"
	@echo "make test   setup, then pytest helpers/ and nbval on every notebook (EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-ci})"
	@echo "make lab    setup, then JupyterLab on $(LAB_IP):$(LAB_PORT) with token auth, on copies of the notebooks in $(LAB_DIR)/notebooks"
	@echo "make lab-test     start \`make lab\` and run notebook 01 in it with headless Chromium"
	@echo "make docker-test  build docker/Dockerfile.cpu, start it with its own CMD, browser-test its lab"
	@echo "make bench  setup, then the benchmark scripts in helpers/benchmarks"
	@echo "make bench-peers  lookup_cpu.py beside torch's EmbeddingBag (torch CPU wheel in $(PEERS_VENV), never in .venv)"
	@echo "make docs   setup, then the documentation site into build/docs (renders the notebooks of \`make run\`)"
	@echo "make clean  remove build outputs and empty data/cache/"

setup: $(VENV)/.requirements $(VENV)/.embedlab
# The HPS's Redis tier needs redis-server / redis-cli (Debian's redis-server): installed where missing.
setup: hps-system
.PHONY: hps-system
hps-system:
	@{ command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || bash ci/install_system.sh

$(VENV)/bin/python:
	@echo "== creating $(VENV) with $$($(PYTHON) --version 2>&1)"
	$(PYTHON) -m venv $(VENV)

$(VENV)/.requirements: requirements.txt | $(VENV)/bin/python
	@echo "== installing requirements.txt into $(VENV) (TensorFlow, Jupyter, ...: a few minutes the first time)"
	$(PIP) install -q -r requirements.txt
	@touch $@

# Built against the TensorFlow installed above (--no-build-isolation). Rebuilt when any source
# of helpers/ changes; CMake's own build folder (helpers/build) keeps the rebuild incremental.
# The build options in a file that changes only when they do: `EMBEDLAB_CUDA=ON make setup`
# after an AUTO build rebuilds.
BUILD_OPTIONS := EMBEDLAB_CUDA=$(EMBEDLAB_CUDA) EMBEDLAB_CPU_ISA=$(EMBEDLAB_CPU_ISA)
$(VENV)/.build-options: FORCE | $(VENV)/bin/python
	@echo '$(BUILD_OPTIONS)' | cmp -s - $@ || echo '$(BUILD_OPTIONS)' > $@
FORCE:

$(VENV)/.embedlab: $(VENV)/.requirements $(VENV)/.build-options $(HELPERS_SRC)
	@echo "== building the EmbedLab kernels and installing helpers/ into $(VENV) (EMBEDLAB_CUDA=$(EMBEDLAB_CUDA):"
	@echo "   about 1-2 minutes for the C++ kernels, a few more when the CUDA ones are built; incremental afterwards)"
	@t0=$$(date +%s); PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PIP) install -q --no-build-isolation --no-deps --force-reinstall ./helpers; \
	  echo "   built in $$(( $$(date +%s) - t0 )) s"
	@$(PY) -c "import embedlab, json; print('   embedlab build:', json.dumps(embedlab.build_info()))"
	@touch $@

# One line per notebook with its time. A failing notebook is still written (with its error) to RUN_DIR,
# the run stops there with a non-zero exit, and the message names the notebook, the cell and the error.
# The kernels' own logs go to build/logs/notebooks (beside RUN_DIR: RUN_DIR/../logs/<name of RUN_DIR>).
RUN_DIR ?= build/notebooks
run: setup
	@export EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-small}; $(PY) ci/run_notebooks.py --output-dir $(RUN_DIR) $(NOTEBOOKS)
	@echo "Open them with: make lab (they are in $(RUN_DIR)/ of its file browser), or jupyter lab $(RUN_DIR)"

test: setup test-py test-nb

test-py:
	export EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-ci}; $(PY) -m pytest helpers/tests -q -rs

# nbval, one notebook at a time: one line each with its time; every notebook runs, then failures
# are printed and the target fails.
test-nb:
	@mkdir -p build/test-nb
	@export EMBEDLAB_SCALE=$${EMBEDLAB_SCALE:-ci}; failed=""; \
	echo "== checking $(words $(NOTEBOOKS)) notebooks with nbval (EMBEDLAB_SCALE=$$EMBEDLAB_SCALE)"; \
	for nb in $(NOTEBOOKS); do \
	  name=$$(basename "$$nb" .ipynb); t0=$$(date +%s); printf '   %-36s ' "$$name"; \
	  if $(PY) -m pytest --nbval-lax -q -p no:cacheprovider "$$nb" > "build/test-nb/$$name.log" 2>&1; then \
	    echo "ok in $$(( $$(date +%s) - t0 )) s ($$(tail -n 1 "build/test-nb/$$name.log" | sed 's/=//g; s/^ *//; s/ in .*//'))"; \
	  else echo "FAILED after $$(( $$(date +%s) - t0 )) s"; failed="$$failed $$name"; fi; \
	done; \
	for name in $$failed; do echo "== $$name"; tail -n 60 "build/test-nb/$$name.log"; done; \
	test -z "$$failed" || { echo "failed notebooks:$$failed"; exit 1; }

# Token authentication stays on and the server binds to LAB_IP; --allow-root is added only when
# running as root (containers, many lab machines), where Jupyter refuses to start without it.
lab: setup
	LAB_IP=$(LAB_IP) LAB_PORT=$(LAB_PORT) LAB_DIR=$(LAB_DIR) bash ci/lab.sh

# The lab as a learner sees it: `make lab` started for real, driven by headless Chromium.
lab-test: setup
	bash ci/lab_test.sh

# The CPU image built and started with its own CMD, its lab driven by headless Chromium.
docker-test: setup
	bash ci/docker_test.sh

# CPU benchmarks always; the GPU one where PyTorch sees a CUDA device (it compares with PyTorch).
bench: setup
	$(PY) helpers/benchmarks/lookup_cpu.py
	$(PY) helpers/benchmarks/loader.py
	$(PY) helpers/benchmarks/hash_table.py
	$(PY) helpers/benchmarks/hps.py
	$(PY) helpers/benchmarks/session.py
	$(PY) helpers/benchmarks/sok.py
	# serving.py serves notebook 05's export: run notebook 05 (make run) first.
	if [ -f "$${EMBEDLAB_DATA_DIR:-data/cache}/hps_triton/serving.json" ]; then $(PY) helpers/benchmarks/serving.py; \
	else echo "serving.py skipped: no notebook-05 export under $${EMBEDLAB_DATA_DIR:-data/cache}/hps_triton (make run first)"; fi
	if $(PY) -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then \
	  $(PY) helpers/benchmarks/lookup_gpu.py; \
	else echo "lookup_gpu.py skipped: no PyTorch with a CUDA device in $(VENV) (see its docstring)"; fi

# The CPU lookup benchmark with the peers' columns: torch.nn.EmbeddingBag (and FBGEMM's CPU TBE,
# fbgemm-gpu-cpu, where a wheel matching that torch installs). torch goes into its own environment,
# $(PEERS_VENV), which sees .venv's packages (TensorFlow, embedlab) through a .pth file; .venv and
# `make setup` never get it. PyPI's default torch is the CUDA build (several GB): PEERS_PIP_ARGS points
# pip at PyTorch's CPU index (where that index cannot be reached, pip's own find-links/indexes answer).
PEERS_VENV := build/peers-venv
PEERS_TORCH ?= torch==2.13.0
PEERS_PIP_ARGS ?= --index-url https://download.pytorch.org/whl/cpu
PEERS_ARGS ?=
bench-peers: setup
	@if [ ! -f $(PEERS_VENV)/.torch ]; then \
	  echo "== creating $(PEERS_VENV) with $(PEERS_TORCH) (CPU build) beside .venv's packages"; \
	  $$(readlink -f $(PY)) -m venv --without-pip $(PEERS_VENV) 2>/dev/null || $(PYTHON) -m venv --without-pip $(PEERS_VENV); \
	  site=$$($(PEERS_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))"); \
	  $(PY) -c "import sysconfig; print(sysconfig.get_path('purelib'))" > "$$site/embedlab_venv.pth"; \
	  $(PIP) --python $(PEERS_VENV)/bin/python install -q $(PEERS_PIP_ARGS) "$(PEERS_TORCH)"; \
	  $(PEERS_VENV)/bin/python -c "import torch; assert not torch.version.cuda, 'a CUDA torch: use its CPU wheel'; print('   torch', torch.__version__)"; \
	  $(PIP) --python $(PEERS_VENV)/bin/python install -q --no-deps $(PEERS_PIP_ARGS) fbgemm-gpu-cpu \
	    && $(PEERS_VENV)/bin/python -c "import torch, fbgemm_gpu" \
	    || echo "   fbgemm-gpu-cpu did not install for this torch: its column is left out"; \
	  touch $(PEERS_VENV)/.torch; fi
	$(PEERS_VENV)/bin/python helpers/benchmarks/lookup_cpu.py $(PEERS_ARGS)

# The documentation site (docs/, Sphinx + MyST-NB) into build/docs/: warnings are errors, then every internal link
# is checked. It renders the executed notebooks of `make run` (build/notebooks/, or DOCS_NOTEBOOKS) without running
# them, and stops with an error naming `make run` when they are missing.
DOCS_NOTEBOOKS ?= build/notebooks
.PHONY: docs
docs: setup
	@missing=""; for nb in $(notdir $(NOTEBOOKS)); do [ -f "$(DOCS_NOTEBOOKS)/$$nb" ] || missing="$$missing $$nb"; done; \
	  if [ -n "$$missing" ]; then echo "make docs: no executed copy in $(DOCS_NOTEBOOKS)/ of:$$missing. Run \`make run\` first (it writes them)." >&2; exit 1; fi
	rm -rf build/docs
	EMBEDLAB_NOTEBOOKS_DIR="$(abspath $(DOCS_NOTEBOOKS))" $(PY) -m sphinx -W --keep-going -n -q -b html docs build/docs
	$(PY) ci/check_docs_links.py build/docs

# Serve notebook 05's export with tritonserver on 127.0.0.1 (HTTP 8000, gRPC 8001, metrics 8002)
# until Ctrl-C; run notebook 05 (the export) first. Options: $(PY) -m embedlab.serving --help
.PHONY: serve
serve: setup
	$(PY) -m embedlab.serving

# Empties data/cache/ (generated data; files committed under data/ stay). Also removes the
# data/cache/ that versions before the checkout-relative DATA_DIR wrote inside .venv.
clean:
	rm -rf build helpers/build $(VENV)/.embedlab
	if [ -d data/cache ]; then find data/cache -mindepth 1 -delete; fi
	rm -rf $(VENV)/lib/python3*/data/cache
