#!/usr/bin/env bash
# The GPU check (aieng/host/gpu_check.py says what it does): run on a host with CUDA, from the
# repository root, after `make install` with the CUDA build of torch.
#   scripts/gpu_check.sh [--store DIR] [--out DIR] [--skip-big] [--requests N]
# Exit 0: every check passed; 1: one failed (the summary says which); 2: no CUDA device here.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
exec "$python" -m aieng.host.gpu_check "$@"
