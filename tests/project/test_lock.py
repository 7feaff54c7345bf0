"""The two install paths (pip lock, conda environment) must pin the same versions."""

import re
from pathlib import Path

from aieng.lockfile import read_lock

ROOT = Path(__file__).resolve().parents[2]


def test_environment_yml_mirrors_the_lock():
    lock = read_lock(ROOT / "requirements.lock")
    env = dict(re.findall(r"^\s+- ([A-Za-z0-9_.\-]+)==(\S+)$", (ROOT / "environment.yml").read_text(), re.M))
    assert lock["torch"] == "2.13.0"
    assert env == lock


def test_every_pyproject_dependency_is_pinned_in_the_lock():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    lock = read_lock(ROOT / "requirements.lock")
    names = {re.split(r"[<>=\[ ]", spec)[0].lower() for spec in wanted}
    missing = sorted(n for n in names if n not in lock and n.replace("_", "-") not in lock)
    assert not missing, f"run `make lock`: not pinned in requirements.lock: {missing}"

