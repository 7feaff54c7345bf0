from aieng.host.hardware import dependency_versions, hardware_profile, matmul_gflops


def test_profile_and_versions_describe_this_host():
    profile = hardware_profile()
    assert profile["cpu_cores"] >= 1 and profile["memory_bytes"] > 0 and profile["device"] in {"cpu", "cuda"}
    versions = dependency_versions()
    assert versions["torch"].startswith("2.13") and versions["aieng"] != "not installed"


def test_matmul_gflops_is_positive_and_restores_threads():
    import torch

    before = torch.get_num_threads()
    assert matmul_gflops(1, size=64, repeats=2) > 0
    assert torch.get_num_threads() == before
