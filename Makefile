# Two commands do all set-up on a fresh machine with Python 3.11 and pip:
#   make serve   venv + the server's locked deps + demo model in the store, then the server on 127.0.0.1:8000
#   make test    the same set-up plus the development lock, then the whole suite (unit, integration,
#                notebooks and runbooks executed as the book, in a browser) and the dependency audit

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
export AIENG_STORE ?= $(CURDIR)/var/store
# Keep the machine's cores for one torch process at a time during tests and builds.
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# Some hosts set PYTHONDONTWRITEBYTECODE=1; then every process (each test run, each server worker)
# compiles every module from source again and pytest rewrites every test's asserts again.
unexport PYTHONDONTWRITEBYTECODE
# The cost tiers of tests/conftest.py that make test-fast selects; it runs them on every core, one
# torch thread per worker (tests/conftest.py). make test runs everything in one process: its servers
# and notebooks compile with the torch threads a server has, and so reuse the compile cache the
# tests before them filled (a worker of one thread compiles other kernels).
FAST_TIERS := not server and not notebook and not perf
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider
# `make test` runs on two pytest-xdist workers, whole files each, costliest first; a test that
# measures time takes the machine alone (tests/machine_share.py). More workers would start more
# servers than two cores hold.
TEST_WORKERS ?= 2

.PHONY: help install install-dev audit lint demo serve test test-fast lab book lock clean

help:
	@echo "make serve   set up (venv, locked deps, demo model) and serve on 127.0.0.1:8000"
	@echo "make test    set up, then run unit, integration, notebook and runbook (papermill) tests"
	@echo "make test-fast  the tests that start no server, run no notebook and bound no timing (unit, model)"
	@echo "make lab     JupyterLab on notebooks/"
	@echo "make book    execute every lesson and runbook dry run into a browsable site: var/book/index.html"
	@echo "make audit   known vulnerabilities in the locks (security/audit-allowlist.toml for accepted ones)"
	@echo "make lint    ruff: lint and format check (ruff format aieng tests scripts fixes the format)"
	@echo "make lock    regenerate the hashed locks in locks/ and environment.yml"

# Every file is pinned with its sha256 in locks/ and installed with --require-hashes (aieng/locks/
# says what each lock holds). torch comes from its own lock: TORCH=auto takes the CPU build from
# PyTorch's CPU index on a CPU host (the registry's build, with its CUDA libraries, where that index
# is out of reach) and the registry's CUDA build where nvidia-smi lists a GPU; TORCH=cpu or
# TORCH=registry chooses. `make serve` installs the server's lock; `make test` and `make lab` add
# the development one.
TORCH ?= auto
LOCKS := locks/pip.lock locks/server.lock locks/torch-cpu.lock locks/torch-registry.lock
$(STAMP): $(LOCKS) pyproject.toml scripts/install-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	scripts/install-deps.sh $(TORCH) $(VENV) locks/server.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (aieng)" >/dev/null
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) locks/dev.lock
	$(BIN)/python -m pip install --require-hashes -r locks/dev.lock
	touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

# Known vulnerabilities in every lock, against the registry (aieng/locks/audit.py says how);
# a finding fails unless security/audit-allowlist.toml allows it with a reason.
audit: $(STAMP)
	$(BIN)/python -m aieng.locks.audit $(LOCKS) locks/dev.lock --allow security/audit-allowlist.toml

# ruff, configured in pyproject.toml; `make test` runs the same check (tests/project/test_lint.py).
lint: $(DEV_STAMP)
	$(BIN)/ruff check aieng tests scripts
	$(BIN)/ruff format --check aieng tests scripts

# Build + register + evaluate + promote the demo model unless the store already has a current one.
demo: $(STAMP)
	$(BIN)/aieng demo install

serve: demo
	$(BIN)/aieng serve

test: $(DEV_STAMP) demo audit
	@if command -v promtool >/dev/null; then promtool check rules deploy/prometheus/alerts.yml; \
	  else echo "promtool not found: alert rules unchecked (apt-get install prometheus)"; fi
	$(PYTEST) tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# While iterating: every test but those that start a real server, run a notebook or assert a timing
# bound (the cost tiers of tests/conftest.py); `make test` runs them all.
test-fast: $(DEV_STAMP) demo
	$(PYTEST) tests -m "$(FAST_TIERS)" -n auto --dist loadfile --durations=10

lab: $(DEV_STAMP) demo
	$(BIN)/jupyter lab notebooks/

# The workbook as a site (aieng/workbook/book.py): every lesson executed, every runbook as a dry run
# on a temporary store and server, one HTML page each and an index in reading order, in var/book/;
# then every page opened in headless Chromium (apt-get install chromium), screenshots kept in
# var/book/screenshots/. tests/workbook/test_book.py does the same in `make test`.
book: $(DEV_STAMP) demo
	$(BIN)/python -m aieng.workbook.book --out var/book --check

LOCK_FLAGS := --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
REGISTRY ?= https://pypi.org/simple
# PyTorch's CPU index only where it answers: pip retries an unreachable index for every package.
TORCH_CPU_FLAG = $(shell $(BIN)/python -c "import urllib.request as r; r.urlopen('$(TORCH_CPU_INDEX)/', timeout=10)" \
  2>/dev/null && echo --extra-index-url $(TORCH_CPU_INDEX))
# Only the registry for the registry's torch: no local wheel folder, no pip configuration.
REGISTRY_ONLY := env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null

# The main locks resolve torch's CPU build (its requirements are those every build shares), then
# aieng.locks.generate moves torch into its two locks; pip-compile downloads the registry's torch
# and CUDA wheels once to read their requirements (several GB, into pip's cache).
lock: $(DEV_STAMP)
	$(BIN)/pip-compile $(LOCK_FLAGS) $(TORCH_CPU_FLAG) -o locks/server.lock pyproject.toml
	$(BIN)/pip-compile $(LOCK_FLAGS) $(TORCH_CPU_FLAG) --extra dev -o locks/dev.lock pyproject.toml
	$(BIN)/python -m aieng.locks.generate split
	cd locks && $(REGISTRY_ONLY) ../$(BIN)/pip-compile $(LOCK_FLAGS) --index-url $(REGISTRY) \
	  -o torch-registry.lock torch-registry.in
	$(BIN)/python -m aieng.locks.generate registry
	$(BIN)/python -m aieng.locks.generate environment

clean:
	rm -rf $(VENV) var/build var/book .pytest_cache
