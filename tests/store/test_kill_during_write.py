"""SIGKILL a store writer anywhere: the store still verifies and ``current`` never points nowhere.

Two kinds of test:
- at chosen points: a child process replaces one step of a switch with ``os._exit`` (a kill
  that lands exactly there), then a fresh process checks the store and lets the next mutation
  recover;
- at random points: a child loops register → promote → rollback → remove and the test
  SIGKILLs it after a random delay, several times, checking the store after each kill.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aieng.store import ModelRef, ModelStore

from ..command import aieng

pytestmark = pytest.mark.timeout(180)


def assert_store_is_sound(root: Path, name: str = "m") -> ModelStore:
    """What a kill must never break, then the next mutation's recovery, then the history."""
    store = ModelStore(root)
    current = store.current(name)
    if current is not None:
        assert (store.model_dir(name) / "current").resolve().is_dir(), f"current -> {current} points nowhere"
    for version in store.versions(name):  # a listed version is whole: no half-registered folder
        report = store.verify(ModelRef(name, version))
        assert report.ok, f"{name}@{version}: {report.problems}"
    with store._lock(name):  # what any next mutation does first
        pass
    assert not store.intent_path(name).exists()
    leftovers = [p.name for p in (store.model_dir(name) / "versions").glob(".*")] if store.versions(name) else []
    assert leftovers == [], f"temporary files left behind: {leftovers}"
    history = store.history(name)  # every line parses
    switches = [e for e in history if e["action"] in ("promote", "rollback")]
    if current is not None and switches:
        assert switches[-1]["to"] == current, "history's last switch disagrees with current"
        assert store.manifest(ModelRef(name, current)).status == "stable"
    assert all(a["to"] == b["from"] for a, b in zip(switches, switches[1:])), "switches did not chain"
    return store


def _run_child(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def two_promoted(store, tiny_llama):
    for version in ("1", "2"):
        store.register(tiny_llama, "m", version)
    store.promote("m", "1")
    return store


_KILL_AT = """
    import os, sys
    from aieng.store import ModelStore
    from aieng.store import store as module
    root, action, point = sys.argv[1], sys.argv[2], sys.argv[3]
    store = ModelStore(root)
    def die(*args, **kwargs):
        os._exit(137)
    if point == "before_link":      # intent written, link not moved
        module.os.symlink = die
    elif point == "after_link":     # link moved, no status, no history
        store._finish_switch = die
    elif point == "torn_history":   # half a history line on disk, then death
        def torn(name, event):
            with open(store.history_path(name), "a") as handle:
                handle.write('{"ts": "half a li')
            os._exit(137)
        store._append_history = torn
    elif point == "manifest_tmp":   # the status write's temporary file made, rename never done
        real_replace = module.os.replace
        def replace(src, dst):
            if str(dst).endswith("manifest.json"):
                os._exit(137)
            real_replace(src, dst)
        import aieng.store.manifest as manifest_module
        manifest_module.os.replace = replace
    if action == "promote":
        store.promote("m", "2")
    else:
        store.rollback("m")
    """


@pytest.mark.parametrize("action", ["promote", "rollback"])
@pytest.mark.parametrize("point", ["before_link", "after_link", "torn_history", "manifest_tmp"])
def test_a_switch_killed_at_each_step_is_finished_or_undone(two_promoted, action, point):
    store = two_promoted
    if action == "rollback":
        store.promote("m", "2")
    before = store.current("m")
    result = _run_child(_KILL_AT, store.root, action, point)
    assert result.returncode == 137, result.stderr
    store = assert_store_is_sound(store.root)
    expected_target = "2" if action == "promote" else "1"
    if point == "before_link":
        assert store.current("m") == before  # undone: nothing happened
    else:
        assert store.current("m") == expected_target  # finished: status and history completed
        assert store.history("m")[-1]["to"] == expected_target
    if action == "rollback" and point != "before_link":
        assert store.manifest(ModelRef("m", "2")).status == "retired"


def _write_forever(root: Path, src: Path, first: int, ready) -> None:
    """register → promote → (rollback) → (remove an old version), until killed."""
    store = ModelStore(root)
    rng = random.Random(first)
    ready.set()
    for i in range(first, first + 10_000):
        store.register(src, "m", str(i))
        store.promote("m", str(i))
        if rng.random() < 0.5:
            store.rollback("m")
        old = [v for v in store.versions("m") if v != store.current("m")]
        if len(old) > 3:
            store.remove("m", old[0])


def test_sigkill_at_random_points_of_register_promote_rollback_remove(store, tiny_llama):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # no interpreter start-up per round: the kills land in the work
    rng = random.Random(1234)
    kills = 12
    for round_ in range(kills):
        ready = ctx.Event()
        child = ctx.Process(target=_write_forever, args=(store.root, tiny_llama, 1000 * (round_ + 1), ready))
        child.start()
        assert ready.wait(30)
        time.sleep(rng.uniform(0.01, 0.3))
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        assert child.exitcode == -signal.SIGKILL, "the loop ended before the kill"
        assert_store_is_sound(store.root)
    assert len(store.history("m")) >= 2 * kills  # the loop got far enough to switch between kills


_TWO_WRITERS = """
    import os, sys, time
    from aieng.errors import StoreError
    from aieng.store import ModelStore
    store = ModelStore(sys.argv[1])
    open(sys.argv[3] + "." + sys.argv[2], "w").close()  # up: imports done
    while not os.path.exists(sys.argv[3]):  # start together, after both interpreters are up
        time.sleep(0.001)
    done = 0
    for i in range(15):
        if sys.argv[2] == "promote":
            store.promote("m", "2" if i % 2 else "1")
            done += 1
        else:
            try:
                store.rollback("m")
                done += 1
            except StoreError as exc:  # the other writer left nothing to roll back to: a refusal, not a switch
                print(exc, file=sys.stderr)
    print(done)
    """


def test_promote_and_rollback_from_two_processes_serialise(two_promoted, tmp_path):
    two_promoted.promote("m", "2")  # something to roll back to from the start
    go = tmp_path / "go"
    script = textwrap.dedent(_TWO_WRITERS)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(two_promoted.root), action, str(go)], stdout=subprocess.PIPE, text=True
        )
        for action in ("promote", "rollback")
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.{action}").exists() for action in ("promote", "rollback")):
        assert time.monotonic() < deadline and all(c.poll() is None for c in children), "a writer never came up"
        time.sleep(0.005)
    go.touch()
    switched = [int(child.communicate(timeout=120)[0]) for child in children]
    assert [child.returncode for child in children] == [0, 0]
    store = assert_store_is_sound(two_promoted.root)  # checks that each switch starts where the last one ended
    assert switched[0] == 15 and switched[1] > 0
    assert len([e for e in store.history("m") if e["action"] in ("promote", "rollback")]) == 2 + sum(switched)


def test_sigkill_during_demo_build_leaves_no_output_and_the_next_build_cleans_up(tmp_path):
    out = tmp_path / "tiny"
    command = [sys.executable, "-m", "aieng.cli.main", "demo", "build", "--shape", "tiny", "--out", str(out)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".tiny.building-*")):  # kill while the temporary folder is filling
        assert child.poll() is None and time.monotonic() < deadline, child.stdout.read()
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    assert not out.exists(), "a killed build must not publish its output"
    assert list(tmp_path.glob(".tiny.building-*")), "(the kill landed after the build: nothing was tested)"
    assert aieng("demo", "build", "--shape", "tiny", "--out", out).returncode == 0  # the next build: in-process
    assert (out / "config.json").is_file()
    assert list(tmp_path.glob(".tiny.building-*")) == []


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_a_full_disk_is_a_clear_error_and_no_partial_version(tmp_path):
    """On a 3 MB disk, 9 MB of weights: the space pre-check refuses before copying; and where the
    disk fills during the copy anyway (another writer), the copy stops with the same promise."""
    from unittest import mock

    from aieng.errors import StoreError
    from tests.store.conftest import make_tiny_llama

    src = make_tiny_llama(tmp_path / "big", hidden_size=256, vocab_size=4096)  # ~9 MB of weights
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "3m"):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        store_root = disk / "store"
        store = ModelStore(store_root)

        def nothing_partial():
            assert store.versions("m") == []
            assert not (store.model_dir("m") / "versions").exists() or not any(
                (store.model_dir("m") / "versions").iterdir()
            )  # no temporary folder either
            assert store.history("m") == []

        result = aieng("model", "register", str(src), "--name", "m", "--version", "1", store=store_root)
        assert result.returncode == 1 and "GiB free; free space (df -h" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        nothing_partial()

        with mock.patch("aieng.store.registration.check_space"), pytest.raises(StoreError) as full:
            store.register(src, "m", "1")  # the pre-check passed, the disk filled during the copy
        assert "no space left on device" in full.value.message
        nothing_partial()
    finally:
        subprocess.run(["umount", str(disk)], check=False)
