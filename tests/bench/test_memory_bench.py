"""``aieng bench memory``: the read-bandwidth ceiling of a batch-1 step, measured for real on a
small buffer, the arithmetic that turns it into tokens per second, and its command."""

import json

import pytest

from aieng.bench.memory_bench import MemoryBandwidth, measure_bandwidth, report
from tests.command import aieng


def test_the_ceiling_is_the_read_bandwidth_over_the_bytes_a_step_reads():
    result = MemoryBandwidth(
        threads=2, buffer_bytes=2**20, repeats=1, read_gb_s=25.0, matvec_gb_s=15.0, kernel_gb_s=20.0
    )
    assert result.matvec_share == pytest.approx(0.6) and result.kernel_share == pytest.approx(0.8)
    assert result.ceiling_tok_s(250_000_000) == pytest.approx(100.0)  # 25 GB/s over 250 MB a step
    assert result.share(60.0, 250_000_000) == pytest.approx(0.6)
    lines = report(result, ("m", 100_000_000))
    assert "103 MB a step: at most 242 tokens/s" in lines[-2]  # int8: a byte a parameter, a scale per 128
    assert "in int4 reads 62 MB a step: at most 400 tokens/s" in lines[-1]  # half a byte, a scale per 32
    assert "400 MB a step: at most 62 tokens/s" in lines[3]  # float32
    assert "20.0 GB/s, 80% of the read bandwidth" in lines[2]
    unbuilt = report(MemoryBandwidth(2, 2**20, 1, 25.0, 15.0))
    assert unbuilt[2].startswith("aieng's matrix-vector kernel: not built")


def test_a_real_measurement_reads_and_multiplies_and_puts_torch_threads_back():
    import torch

    before = torch.get_num_threads()
    result = measure_bandwidth(threads=1, buffer_mib=8, repeats=2)
    assert torch.get_num_threads() == before
    assert result.threads == 1 and result.buffer_bytes == 8 * 2**20
    assert 0 < result.read_gb_s < float("inf") and 0 < result.matvec_gb_s < float("inf")
    assert 0 < result.kernel_gb_s < float("inf")  # this machine builds the kernels
    with pytest.raises(ValueError, match=">= 1"):
        measure_bandwidth(buffer_mib=0)


def test_the_command_reports_a_models_ceilings_and_refuses_bad_sizes(tiny_demo_dir):
    from aieng.store.introspect import inspect_folder

    done = aieng("bench", "memory", "--mib", "8", "--repeats", "2", "--model", str(tiny_demo_dir), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["num_parameters"] == inspect_folder(tiny_demo_dir).num_parameters
    assert set(result) >= {"read_gb_s", "matvec_gb_s", "matvec_share", "kernel_gb_s", "kernel_share", "threads"}
    text = aieng("bench", "memory", "--mib", "8", "--repeats", "1", "--model", str(tiny_demo_dir))
    assert "read bandwidth" in text.stdout and "at batch 1 here" in text.stdout
    refused = aieng("bench", "memory", "--mib", "0")
    assert refused.returncode != 0 and "--mib" in (refused.stderr + refused.stdout)
