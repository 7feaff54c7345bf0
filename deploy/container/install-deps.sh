#!/bin/sh
# Install requirements.lock into a virtual environment, for the container image's build stage.
#   install-deps.sh cpu|gpu LOCK VENV [--dry-run]
# cpu: the whole lock with --require-hashes; the lock's torch hash is the CPU wheel's, which the
#      PyTorch CPU index serves (PyPI's torch wheel for Linux x86-64 is the CUDA build, several GB).
# gpu: torch from the PyTorch CUDA index first (it brings its nvidia-* and triton wheels, which the
#      CPU lock does not pin), then the rest of the lock with --require-hashes. On a GPU host,
#      `make lock` there pins that host's torch wheel instead (see the Makefile).
# --dry-run prints the commands instead of running them: the test suite checks them that way.
set -eu
variant=$1 lock=$2 venv=$3 dry=${4:-}
: "${TORCH_INDEX_CPU:=https://download.pytorch.org/whl/cpu}"
: "${TORCH_INDEX_GPU:=https://download.pytorch.org/whl/cu128}"
pip="$venv/bin/python -m pip install --no-cache-dir"
run() { if [ "$dry" = "--dry-run" ]; then echo "$*"; else sh -c "$*"; fi; }

torch_pin=$(grep -E '^torch==' "$lock" | sed 's/ .*//')
[ -n "$torch_pin" ] || { echo "install-deps.sh: no torch== pin in $lock" >&2; exit 2; }
case "$variant" in
  cpu)
    run "$pip --require-hashes --extra-index-url $TORCH_INDEX_CPU -r $lock" ;;
  gpu)
    rest=$(mktemp)
    # the lock without torch's entry (its line, its --hash lines and its '# via' comment)
    awk '/^torch==/ {skip=1; next} skip && /^[ \t]/ {next} {skip=0; print}' "$lock" > "$rest"
    run "$pip --index-url $TORCH_INDEX_GPU $torch_pin"
    run "$pip --require-hashes -r $rest" ;;
  *)
    echo "install-deps.sh: variant must be cpu or gpu, got '$variant'" >&2; exit 2 ;;
esac
