# Two commands do all set-up on a fresh machine with Python 3.11 and pip:
#   make serve   venv + the server's locked deps + demo model in the store, then the server on 127.0.0.1:8000
#   make test    the same set-up plus the development lock, then the whole suite (unit, integration,
#                notebooks, runbooks) and the dependency audit

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

.PHONY: help install install-dev audit demo serve test test-fast lab lock clean

help:
	@echo "make serve   set up (venv, locked deps, demo model) and serve on 127.0.0.1:8000"
	@echo "make test    set up, then run unit, integration, notebook (nbval) and runbook (papermill) tests"
	@echo "make lab     JupyterLab on notebooks/"
	@echo "make audit   known vulnerabilities in the locks (security/audit-allowlist.toml for accepted ones)"
	@echo "make lock    regenerate requirements.lock, requirements-dev.lock (hashed) and environment.yml"

# requirements.lock: what the server runs on; requirements-dev.lock: that plus the workbook, the
# test suite and the benchmark peers. Both pin every package with its sha256 and are installed
# with --require-hashes, so a wheel that differs from the one locked is refused. `make serve`
# installs the server's lock only; `make test` and `make lab` add the development one.
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (aieng)" >/dev/null
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.lock
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements-dev.lock
	touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

# Known vulnerabilities in either lock, against the registry (aieng/lock_audit.py says how);
# a finding fails unless security/audit-allowlist.toml allows it with a reason.
audit: $(STAMP)
	$(BIN)/python -m aieng.lock_audit requirements.lock requirements-dev.lock --allow security/audit-allowlist.toml

# Build + register + evaluate + promote the demo model unless the store already has a current one.
demo: $(STAMP)
	$(BIN)/aieng demo install

serve: demo
	$(BIN)/aieng serve

test: $(DEV_STAMP) demo audit
	@if command -v promtool >/dev/null; then promtool check rules deploy/prometheus/alerts.yml; \
	  else echo "promtool not found: alert rules unchecked (apt-get install prometheus)"; fi
	$(BIN)/python -m pytest tests --nbval-lax notebooks -p no:cacheprovider --durations=25

lab: $(DEV_STAMP) demo
	$(BIN)/jupyter lab notebooks/

LOCK_FLAGS := --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links

lock: $(DEV_STAMP)
	$(BIN)/pip-compile $(LOCK_FLAGS) -o requirements.lock pyproject.toml
	$(BIN)/pip-compile $(LOCK_FLAGS) --extra dev -o requirements-dev.lock pyproject.toml
	# the CPU wheel on disk reports 2.13.0+cpu; pin the public version (its hash stays the CPU
	# wheel's: on a GPU host, run `make lock` there to lock that host's torch wheel)
	sed -i 's/^torch==\(.*\)+cpu/torch==\1/' requirements.lock requirements-dev.lock
	$(BIN)/python -m aieng.lockfile requirements-dev.lock environment.yml

clean:
	rm -rf $(VENV) var/build .pytest_cache
