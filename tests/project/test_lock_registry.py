"""The locks against the registry: the file pip would take on this platform is the file locked.

The first test asks the real registry, as a user's machine with no local wheel folder would; it
needs the network and skips without it unless AIENG_REQUIRE_REGISTRY=1 (set by .ci/run), so CI
cannot pass by skipping it. The others pin down the choice of file against a loopback index.
"""

import os
import sys
from pathlib import Path

import httpx
import pytest
from packaging.tags import sys_tags

from aieng.locks import registry_check
from aieng.locks.lockfile import Block

ROOT = Path(__file__).resolve().parents[2]
REGISTRY_LOCKS = ["pip.lock", "server.lock", "dev.lock", "torch-registry.lock"]


def test_the_registry_serves_every_locked_file_for_this_platform():
    try:
        httpx.get(registry_check.REGISTRY + "/pip/", timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        if os.environ.get("AIENG_REQUIRE_REGISTRY") == "1":
            raise
        pytest.skip(f"the package registry is out of reach: {exc}")
    checked, problems = registry_check.check_locks([ROOT / "locks" / name for name in REGISTRY_LOCKS])
    assert checked > 150
    assert not problems, "\n".join(map(str, problems))


def _file(name: str, digest: str, **extra) -> dict:
    return {"filename": name, "hashes": {"sha256": digest}, **extra}


HERE = next(iter(sys_tags()))  # this interpreter's most preferred tag
PY = f"cp{sys.version_info.major}{sys.version_info.minor}"


def test_the_best_wheel_for_this_interpreter_is_chosen_over_sdists_and_foreign_wheels():
    files = [
        _file("pkg-1.0.tar.gz", "a" * 64),
        _file("pkg-1.0-py3-none-any.whl", "b" * 64),
        _file(f"pkg-1.0-{HERE.interpreter}-{HERE.abi}-{HERE.platform}.whl", "c" * 64),
        _file(f"pkg-1.0-{PY}-{PY}-win_amd64.whl", "d" * 64),
        _file("pkg-2.0-py3-none-any.whl", "e" * 64),
    ]
    assert registry_check.chosen_file(files, "1.0")["hashes"]["sha256"] == "c" * 64
    assert registry_check.chosen_file(files[:2], "1.0")["hashes"]["sha256"] == "b" * 64
    assert registry_check.chosen_file(files[:1], "1.0")["hashes"]["sha256"] == "a" * 64
    assert registry_check.chosen_file(files[3:4], "1.0") is None


def test_yanked_files_and_those_for_another_python_are_not_chosen():
    files = [
        _file("pkg-1.0-py3-none-any.whl", "b" * 64, yanked="broken"),
        _file("pkg-1.0.tar.gz", "a" * 64, **{"requires-python": ">=99"}),
    ]
    assert registry_check.chosen_file(files, "1.0") is None


def test_a_lock_that_carries_another_builds_hash_is_a_problem_naming_the_served_file():
    page = {"files": [_file("torch-2.13.0-py3-none-any.whl", "f" * 64)]}
    problem = registry_check.check_block(Block("torch", "2.13.0", hashes=["6" * 64]), page, "server.lock")
    assert problem is not None and "torch-2.13.0-py3-none-any.whl" in problem.detail and "f" * 64 in problem.detail
    assert registry_check.check_block(Block("torch", "2.13.0", hashes=["6" * 64, "f" * 64]), page, "x") is None


@pytest.fixture
def index(json_site):
    return (
        json_site(
            {
                "simple/good": {"files": [_file("good-1.0-py3-none-any.whl", "1" * 64)]},
                "simple/linuxonly": {"files": [_file("linuxonly-1.0-py3-none-any.whl", "2" * 64)]},
            }
        )
        + "/simple"
    )


def test_the_command_fails_on_a_missing_project_and_skips_pins_whose_marker_does_not_hold(index, tmp_path, capsys):
    lock = tmp_path / "x.lock"
    lock.write_text(
        f"good==1.0 \\\n    --hash=sha256:{'1' * 64}\n"
        f"linuxonly==1.0 ; sys_platform == 'nowhere' \\\n    --hash=sha256:{'0' * 64}\n"
    )
    assert registry_check.main([str(lock), "--registry", index]) == 0
    assert "checked 1 pins" in capsys.readouterr().out
    lock.write_text(lock.read_text() + f"gone==1.0 \\\n    --hash=sha256:{'3' * 64}\n")
    assert registry_check.main([str(lock), "--registry", index]) == 1
    assert "FAIL x.lock: gone==1.0: the registry has no such project" in capsys.readouterr().out
