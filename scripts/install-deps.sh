#!/usr/bin/env bash
# Install aieng's locked dependencies into a virtual environment, every file hash-checked.
#
#   scripts/install-deps.sh [--dry-run] TORCH VENV LOCK...
#
# TORCH says which build of torch, and from where (aieng/locks/__init__.py describes the locks):
#   cpu       locks/torch-cpu.lock from PyTorch's CPU wheel index ($AIENG_TORCH_CPU_INDEX):
#             the CPU build, about 190 MB, nothing else.
#   registry  locks/torch-registry.lock from the package registry: on Linux its build for CUDA
#             GPUs, with the nvidia-* and triton wheels it requires (about 2.7 GB); on macOS and
#             Windows the registry's build is the CPU one.
#   gpu       the same as registry (the container image's VARIANT=gpu).
#   auto      registry on a host where `nvidia-smi -L` lists a GPU; cpu on any other Linux x86-64
#             host, falling back to registry when the CPU index cannot be reached or lacks the
#             file; registry elsewhere (the CPU lock holds the Linux x86-64 file only).
# Then pip (locks/pip.lock), then each LOCK, all with --require-hashes, then `pip check`.
# A file whose hash differs from the lock's is always an error, never a reason to fall back.
# --dry-run prints the pip commands instead of running them (tests/deploy check them that way).
set -euo pipefail

dry=
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
if [ $# -lt 2 ]; then
  echo "usage: scripts/install-deps.sh [--dry-run] cpu|registry|gpu|auto VENV [LOCK...]" >&2; exit 2
fi
torch=$1 venv=$2; shift 2
locks=$(cd "$(dirname "$0")/../locks" && pwd)
cpu_index=${AIENG_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
pip=("$venv/bin/python" -m pip install --require-hashes)

run() {
  if [ -n "$dry" ]; then echo "$*"; else "$@"; fi
}

has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

install_cpu_torch() {  # exit status 0: installed; 3: the index (or a folder) has no such file
  echo "torch: the CPU build from $cpu_index (about 190 MB)"
  if [ -n "$dry" ]; then run "${pip[@]}" --no-deps --index-url "$cpu_index" -r "$locks/torch-cpu.lock"; return; fi
  local log; log=$(mktemp)
  if "${pip[@]}" --no-deps --retries 1 --timeout 30 --index-url "$cpu_index" -r "$locks/torch-cpu.lock" 2>&1 \
      | tee "$log"; then
    rm -f "$log"; return 0
  fi
  if grep -q "DO NOT MATCH THE HASHES" "$log"; then
    echo "install-deps.sh: $cpu_index served a torch file whose hash is not in locks/torch-cpu.lock;" \
         "refusing it (run \`make lock\` if the lock is out of date)" >&2
    rm -f "$log"; exit 1
  fi
  rm -f "$log"; return 3
}

install_registry_torch() {
  echo "torch: the package registry's build; on Linux it brings CUDA libraries (about 2.7 GB to download)"
  run "${pip[@]}" --no-deps -r "$locks/torch-registry.lock"
}

case "$torch" in
  cpu|registry|gpu|auto) ;;
  *) echo "install-deps.sh: TORCH must be cpu, registry, gpu or auto, got '$torch'" >&2; exit 2 ;;
esac
run "${pip[@]}" --quiet -r "$locks/pip.lock"
case "$torch" in
  cpu) install_cpu_torch || { echo "install-deps.sh: no torch from $cpu_index" >&2; exit 1; } ;;
  registry|gpu) install_registry_torch ;;
  auto)
    if has_gpu; then
      echo "torch: nvidia-smi lists a GPU"; install_registry_torch
    elif [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
      install_cpu_torch || {
        echo "torch: PyTorch's CPU index ($cpu_index) gave no file; falling back to the registry's build"
        install_registry_torch
      }
    else
      install_registry_torch
    fi ;;
esac
for lock in "$@"; do
  echo "$(basename "$lock"): $(grep -c '^[a-z0-9]' "$lock") packages"
  run "${pip[@]}" --progress-bar on -r "$lock"
done
run "$venv/bin/python" -m pip check
