"""The locks: the server's own (requirements.lock) inside the development one (requirements-dev.lock),
every pin hashed, and the conda environment pinning the same versions."""

import re
from pathlib import Path

from aieng.lockfile import read_lock

ROOT = Path(__file__).resolve().parents[2]


def _project():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(specs):
    return {re.split(r"[<>=\[ ;]", spec)[0].lower().replace("_", "-") for spec in specs}


def test_environment_yml_mirrors_the_dev_lock():
    lock = read_lock(ROOT / "requirements-dev.lock")
    env = dict(re.findall(r"^\s+- ([A-Za-z0-9_.\-]+)==(\S+)$", (ROOT / "environment.yml").read_text(), re.M))
    assert lock["torch"] == "2.13.0"
    assert env == lock


def test_the_production_lock_is_the_dev_lock_without_the_dev_tools():
    prod, dev = read_lock(ROOT / "requirements.lock"), read_lock(ROOT / "requirements-dev.lock")
    assert {k: dev.get(k) for k in prod} == prod, "run `make lock`: the two locks pin different versions"
    dev_only = _names(_project()["optional-dependencies"]["dev"]) - _names(_project()["dependencies"])
    assert not dev_only & set(prod), f"development tools in the production lock: {sorted(dev_only & set(prod))}"
    assert {"jupyterlab", "pytest", "nbval", "papermill"} <= set(dev)


def test_every_dependency_is_pinned_and_every_pin_is_hashed():
    for lock_name, specs in [("requirements.lock", _project()["dependencies"]),
                             ("requirements-dev.lock", _project()["dependencies"] + _project()["optional-dependencies"]["dev"])]:
        text = (ROOT / lock_name).read_text()
        lock = read_lock(ROOT / lock_name)
        missing = sorted(n for n in _names(specs) if n not in lock)
        assert not missing, f"run `make lock`: not pinned in {lock_name}: {missing}"
        # each requirement block: a pin line ending in a backslash, then its --hash lines
        blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
        unhashed = [b.split()[0] for b in blocks if re.match(r"[A-Za-z0-9_.\-]+==", b) and "--hash=sha256:" not in b]
        assert not unhashed, f"{lock_name}: pins without a hash (pip --require-hashes would refuse them): {unhashed}"
