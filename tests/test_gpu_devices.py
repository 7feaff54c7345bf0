"""CUDA_VISIBLE_DEVICES as CUDA reads it, mapped to NVML's devices: indices, GPU UUIDs whole or by
prefix, MIG instances in both spellings. NVML is faked at pynvml's boundary: a host of three GPUs,
the last in MIG mode with two instances."""

import pytest

from aieng.host import gpus


class FakeNVML:
    class NVMLError(Exception):
        pass

    def __init__(self):
        self.gpus = [
            {"uuid": "GPU-aaaa1111-0000", "total": 80, "migs": None},
            {"uuid": "GPU-aaaa2222-0000", "total": 40, "migs": None},
            {"uuid": "GPU-bbbb3333-0000", "total": 96, "migs": [(1, 0, 20), (2, 0, 10)]},  # (gi, ci, GiB)
        ]

    # handles: ("gpu", i) or ("mig", i, slot)
    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.gpus):
            raise self.NVMLError("invalid argument")
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle):
        gpu = self.gpus[handle[1]]
        if handle[0] == "gpu":
            return gpu["uuid"].encode()  # older pynvml answers bytes
        gi, ci, _ = gpu["migs"][handle[2]]
        return f"MIG-{handle[1]}{gi}{ci}-cafe"

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        if self.gpus[handle[1]]["migs"] is None:
            raise self.NVMLError("not supported")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):
        if slot >= len(self.gpus[handle[1]]["migs"]):
            raise self.NVMLError("not found")
        return ("mig", handle[1], slot)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle):
        return ("gpu", handle[1])

    def nvmlDeviceGetGpuInstanceId(self, handle):
        return self.gpus[handle[1]]["migs"][handle[2]][0]

    def nvmlDeviceGetComputeInstanceId(self, handle):
        return self.gpus[handle[1]]["migs"][handle[2]][1]

    def nvmlDeviceGetMemoryInfo(self, handle):
        gpu = self.gpus[handle[1]]
        total = gpu["total"] if handle[0] == "gpu" else gpu["migs"][handle[2]][2]
        return type("Memory", (), {"total": total * 2**30})()


@pytest.mark.parametrize(
    "visible, expected",
    [
        (None, None),
        ("", []),
        ("2,0", ["2", "0"]),
        ("1, GPU-aaaa1111", ["1", "GPU-aaaa1111"]),
        ("0,-1,1", ["0"]),  # CUDA stops at the first entry that is not a device
        ("0,nope,1", ["0"]),
        ("MIG-GPU-bbbb3333-0000/1/0", ["MIG-GPU-bbbb3333-0000/1/0"]),
    ],
)
def test_the_visible_list_is_read_as_cuda_reads_it(visible, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert gpus.visible_devices(environ) == expected


@pytest.mark.parametrize(
    "visible, index, expected",
    [
        (None, 1, ("gpu", 1)),  # unset: torch's numbering is NVML's (PCI bus order, set by aieng)
        ("2,0", 0, ("gpu", 2)),
        ("2,0", 1, ("gpu", 0)),
        ("GPU-aaaa2222-0000", 0, ("gpu", 1)),  # a whole UUID
        ("GPU-bbbb", 0, ("gpu", 2)),  # a unique prefix, as CUDA accepts
        ("MIG-210-cafe", 0, ("mig", 2, 0)),  # a MIG instance by its UUID
        ("MIG-GPU-bbbb3333-0000/2/0", 0, ("mig", 2, 1)),  # the older MIG spelling
    ],
)
def test_torchs_device_index_maps_to_nvmls_device(visible, index, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert gpus.nvml_handle(FakeNVML(), index, environ) == expected


@pytest.mark.parametrize(
    "visible, index, message",
    [
        ("GPU-aaaa", 0, "names 2 devices"),  # a prefix of two GPUs is no device
        ("GPU-ffff", 0, "names 0 devices"),
        ("0", 1, "cuda:1 is not among"),
        ("MIG-GPU-bbbb3333-0000/9/0", 0, "no MIG instance"),
    ],
)
def test_a_visible_entry_that_names_no_single_device_is_said(visible, index, message):
    with pytest.raises(LookupError, match=message):
        gpus.nvml_handle(FakeNVML(), index, {"CUDA_VISIBLE_DEVICES": visible})


def test_totals_come_from_nvml_for_uuids_and_mig_instances(monkeypatch):
    import torch

    monkeypatch.setattr(gpus, "_nvml", lambda: FakeNVML())
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa2222-0000,MIG-GPU-bbbb3333-0000/1/0")
    assert gpus.gpu_totals() == [40 * 2**30, 20 * 2**30]  # the MIG instance's memory, not its card's


def test_nvml_is_in_the_gpu_lock():
    """Without nvidia-ml-py a GPU host has no utilisation metric and asks totals of a subprocess."""
    from pathlib import Path

    lock = (Path(__file__).parents[1] / "locks" / "torch-registry.lock").read_text()
    assert '\nnvidia-ml-py==13.615.71 ; platform_system == "Linux"' in lock
