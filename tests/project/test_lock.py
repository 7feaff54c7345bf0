"""The locks in locks/: the server's inside the development one, torch apart in its two builds,
every pin hashed, and the conda environment pinning the same versions."""

import re
from pathlib import Path

from aieng.locks.lockfile import parse_lock, read_blocks, read_lock

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "locks"


def _project():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(specs):
    return {re.split(r"[<>=\[ ;]", spec)[0].lower().replace("_", "-") for spec in specs}


def test_environment_yml_mirrors_the_dev_lock_and_torchs_release():
    lock = read_lock(LOCKS / "dev.lock")
    env = dict(re.findall(r"^\s+- ([A-Za-z0-9_.\-]+)==(\S+)$", (ROOT / "environment.yml").read_text(), re.M))
    assert env.pop("torch") == "2.13.0"
    assert env == lock


def test_the_production_lock_is_the_dev_lock_without_the_dev_tools():
    prod, dev = read_lock(LOCKS / "server.lock"), read_lock(LOCKS / "dev.lock")
    assert {k: dev.get(k) for k in prod} == prod, "run `make lock`: the two locks pin different versions"
    dev_only = _names(_project()["optional-dependencies"]["dev"]) - _names(_project()["dependencies"])
    assert not dev_only & set(prod), f"development tools in the production lock: {sorted(dev_only & set(prod))}"
    assert {"jupyterlab", "pytest", "nbval", "papermill"} <= set(dev)


def test_every_dependency_is_pinned_and_every_pin_is_hashed():
    torch = {"torch"}
    for lock_name, specs in [
        ("server.lock", _project()["dependencies"]),
        ("dev.lock", _project()["dependencies"] + _project()["optional-dependencies"]["dev"]),
    ]:
        lock = read_lock(LOCKS / lock_name)
        missing = sorted(n for n in _names(specs) - torch if n not in lock)
        assert not missing, f"run `make lock`: not pinned in {lock_name}: {missing}"
    for path in LOCKS.glob("*.lock"):
        blocks = parse_lock(path.read_text())[1]
        assert blocks, path
        unhashed = [b.name for b in blocks if not b.hashes]
        assert not unhashed, f"{path.name}: pins without a hash (pip --require-hashes would refuse them): {unhashed}"


def test_torch_is_locked_apart_in_its_cpu_and_registry_builds_at_the_projects_version():
    required = next(s for s in _project()["dependencies"] if s.startswith("torch"))
    version = required.split("==")[1]
    for name in ("server.lock", "dev.lock"):
        assert "torch" not in read_lock(LOCKS / name), f"{name} pins torch: the torch locks hold it"
    cpu = read_blocks(LOCKS / "torch-cpu.lock")
    assert list(cpu) == ["torch"] and cpu["torch"].version == f"{version}+cpu"
    registry = read_blocks(LOCKS / "torch-registry.lock")
    assert registry["torch"].version == version and registry["torch"].marker is None
    assert len(registry["torch"].hashes) >= 2  # every platform's file of the release
    assert not set(registry["torch"].hashes) & set(cpu["torch"].hashes)
    cuda = [b for b in registry.values() if b.name != "torch"]
    assert any(b.name.startswith("nvidia-") for b in cuda) and "triton" in registry
    assert all(b.marker == 'platform_system == "Linux"' for b in cuda)  # torch's own marker for them
    shared = set(registry) & set(read_lock(LOCKS / "server.lock"))
    assert not shared, f"the registry's torch lock repeats packages of server.lock: {sorted(shared)}"
    assert list(read_lock(LOCKS / "pip.lock")) == ["pip"]
