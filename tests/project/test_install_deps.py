"""scripts/install-deps.sh's choice of torch, with a stand-in for the venv's pip.

The stand-in is the one fake here: a real CPU index that is out of reach, or one that serves a
file of another hash, cannot be produced on demand. It records every pip command and answers as
pip does in each case; the script's decisions (fall back, refuse, which lock) are what is tested.
"""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-deps.sh"

PIP_NO_FILE = "ERROR: No matching distribution found for torch==2.13.0+cpu"
PIP_BAD_HASH = "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE."


def _venv(tmp_path, cpu_index_answer: str | None) -> Path:
    """A venv whose python records its arguments; a CPU-index install prints ``cpu_index_answer`` and fails."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    fail = f'echo "{cpu_index_answer}" >&2; exit 1' if cpu_index_answer else "exit 0"
    python.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls"\ncase "$*" in *whl/cpu*) {fail} ;; esac\nexit 0\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return venv


def _run(tmp_path, torch: str, venv: Path, path_dirs: str = "/usr/bin:/bin"):
    result = subprocess.run(
        [SCRIPT, torch, venv, str(ROOT / "locks" / "server.lock")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path_dirs},
        timeout=60,
    )
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return result, calls


@pytest.fixture
def cpu_host(tmp_path):
    """PATH without nvidia-smi, on this Linux x86-64 machine."""
    if os.uname().sysname != "Linux" or os.uname().machine != "x86_64":
        pytest.skip("auto picks the CPU lock on Linux x86-64 only")
    return "/usr/bin:/bin"


def test_auto_on_a_cpu_host_takes_the_cpu_build_and_nothing_from_the_registry(tmp_path, cpu_host):
    result, calls = _run(tmp_path, "auto", _venv(tmp_path, None), cpu_host)
    assert result.returncode == 0, result.stderr
    assert any("torch-cpu.lock" in c and "--index-url https://download.pytorch.org/whl/cpu" in c for c in calls)
    assert not any("torch-registry.lock" in c for c in calls)
    assert all("--require-hashes" in c for c in calls if " install " in f" {c} ")
    assert calls[-1] == "-m pip check"


def test_auto_falls_back_to_the_registry_when_the_cpu_index_has_no_file(tmp_path, cpu_host):
    result, calls = _run(tmp_path, "auto", _venv(tmp_path, PIP_NO_FILE), cpu_host)
    assert result.returncode == 0, result.stderr
    assert "falling back to the registry's build" in result.stdout
    assert any("--no-deps -r" in c and "torch-registry.lock" in c for c in calls)


def test_a_file_of_another_hash_is_refused_never_a_reason_to_fall_back(tmp_path, cpu_host):
    result, calls = _run(tmp_path, "auto", _venv(tmp_path, PIP_BAD_HASH), cpu_host)
    assert result.returncode == 1 and "refusing it" in result.stderr
    assert not any("torch-registry.lock" in c for c in calls) and not any("server.lock" in c for c in calls)


def test_cpu_never_falls_back_to_the_cuda_build(tmp_path):
    result, calls = _run(tmp_path, "cpu", _venv(tmp_path, PIP_NO_FILE))
    assert result.returncode == 1 and "no torch from" in result.stderr
    assert not any("torch-registry.lock" in c for c in calls)


def test_auto_on_a_gpu_host_takes_the_registrys_cuda_build(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    result, calls = _run(tmp_path, "auto", _venv(tmp_path, None), f"{fake_bin}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert any("torch-registry.lock" in c for c in calls) and not any("torch-cpu.lock" in c for c in calls)
