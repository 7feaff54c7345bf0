"""scripts/gpu_check.sh on a host without CUDA: says so and exits 2 (no check can pass or fail here)."""

import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU host runs the whole check instead")
def test_the_gpu_check_refuses_a_host_without_cuda_with_exit_status_2(tmp_path):
    import sys

    run = subprocess.run(
        [ROOT / "scripts" / "gpu_check.sh", "--out", tmp_path],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert run.returncode == 2 and "no CUDA device" in run.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_the_canary_check_finds_a_device_past_its_memory_fraction():
    from aieng.host.gpu_check_workers import _over_fraction

    text = (
        "# TYPE aieng_cuda_memory_reserved_bytes gauge\n"
        'aieng_cuda_memory_reserved_bytes{device="cuda:0",pid="1"} 85.0\n'
        'aieng_cuda_memory_reserved_bytes{device="cuda:1",pid="2"} 95.0\n'
        "# TYPE aieng_cuda_memory_total_bytes gauge\n"
        'aieng_cuda_memory_total_bytes{device="cuda:0",pid="1"} 100.0\n'
        'aieng_cuda_memory_total_bytes{device="cuda:1",pid="2"} 100.0\n'
    )
    assert _over_fraction(text, 0.9) == ["2 cuda:1"]
