"""The CLI as a user runs it: exit codes, one-line errors, an untouched store on failure.

Commands run in this process (``tests/command.py``: ``main(argv)`` with captured streams); the
console entry point itself is run once as a subprocess, the way a shell starts it."""

import subprocess
import sys

import pytest

from aieng.bench.server_process import ServerProcess, ServerStartError, free_port
from aieng.store import ModelRef, ModelStore

from ..command import aieng

COMMANDS = [
    [],
    ["demo"],
    ["demo", "build"],
    ["demo", "install"],
    ["model"],
    ["model", "register"],
    ["model", "list"],
    ["model", "show"],
    ["model", "verify"],
    ["model", "promote"],
    ["model", "rollback"],
    ["model", "remove"],
    ["release"],
    ["release", "watch"],
    ["release", "canary"],
    ["triage"],
    ["loadtest"],
    ["model", "convert"],
    ["model", "history"],
    ["model", "inspect"],
    ["eval"],
    ["serve"],
    ["bench", "grammar"],
]


def test_the_entry_point_runs_as_a_process_with_its_exit_status(tmp_path):
    helped = subprocess.run([sys.executable, "-m", "aieng", "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "usage: aieng" in helped.stdout
    failed = subprocess.run(
        [sys.executable, "-m", "aieng", "--store", str(tmp_path / "store"), "model", "rollback", "nothing"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1 and failed.stderr.startswith("aieng: error: ") and "Traceback" not in failed.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "aieng")
def test_every_command_has_help(command):
    result = aieng(*command, "--help")
    assert result.returncode == 0 and "usage: aieng" in result.stdout


def test_serve_help_documents_the_settings():
    out = aieng("serve", "--help").stdout
    for name in ("AIENG_STORE", "AIENG_MODEL", "AIENG_HOST", "AIENG_PORT"):
        assert name in out


def test_store_workflow_and_failures(tmp_path, tiny_demo_dir):
    store = tmp_path / "store"
    assert (
        aieng("model", "register", str(tiny_demo_dir), "--name", "tiny", "--version", "1", store=store).returncode == 0
    )
    assert (
        aieng("model", "register", str(tiny_demo_dir), "--name", "tiny", "--version", "2", store=store).returncode == 0
    )

    dup = aieng("model", "register", str(tiny_demo_dir), "--name", "tiny", "--version", "1", store=store)
    assert dup.returncode == 1 and dup.stderr.strip().count("\n") == 0 and "already exists" in dup.stderr

    none = aieng("model", "rollback", "tiny", store=store)
    assert none.returncode == 1 and "no previous promoted version" in none.stderr

    unevaluated = aieng("model", "promote", "tiny", "1", store=store)
    assert unevaluated.returncode == 1 and "release gate refused tiny@1 (rules: evidence)" in unevaluated.stderr
    no_reason = aieng("model", "promote", "tiny", "1", "--force", store=store)
    assert no_reason.returncode == 1 and "needs --reason" in no_reason.stderr
    forced = ("--force", "--reason", "test: store workflow without an eval")
    assert aieng("model", "promote", "tiny", "1", *forced, store=store).returncode == 0
    assert aieng("model", "promote", "tiny", "2", *forced, store=store).returncode == 0
    listing = aieng("model", "list", store=store).stdout
    assert "* tiny" in listing and "2" in listing

    current = aieng("model", "remove", "tiny", "2", store=store)
    assert current.returncode == 1 and "is current" in current.stderr

    back = aieng("model", "rollback", "tiny", "--reason", "bad canary", store=store)
    assert back.returncode == 0 and "2 -> 1" in back.stdout
    assert "bad canary" in aieng("model", "history", "tiny", store=store).stdout
    assert '"status": "retired"' in aieng("model", "show", "tiny@2", store=store).stdout


def test_tampered_version_fails_verify_and_serve_refuses_to_start(tmp_path, tiny_demo_dir):
    store = tmp_path / "store"
    aieng("model", "register", str(tiny_demo_dir), "--name", "tiny", "--version", "1", store=store)
    aieng("model", "promote", "tiny", "1", "--force", "--reason", "test: not evaluated", store=store)
    assert aieng("model", "verify", "tiny", store=store).returncode == 0

    weights = store / "tiny" / "versions" / "1" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))

    verify = aieng("model", "verify", "tiny", store=store)
    assert verify.returncode == 1 and "mismatched: model.safetensors" in verify.stderr

    with pytest.raises(ServerStartError) as info:
        ServerProcess(store=store, model="tiny", ready_timeout=120).start()
    assert info.value.returncode == 1
    assert "failed verification" in info.value.output and "model.safetensors" in info.value.output


def test_pickle_refusal_leaves_the_store_unchanged(tmp_path, tiny_demo_dir):
    import shutil

    src = shutil.copytree(tiny_demo_dir, tmp_path / "src")
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04")
    store = tmp_path / "store"
    result = aieng("model", "register", str(src), "--name", "tiny", "--version", "1", store=store)
    assert result.returncode == 1 and "aieng model convert" in result.stderr
    assert not (store / "tiny" / "versions" / "1").exists()


def test_a_timeout_is_one_line_of_error_not_a_traceback(tmp_path):
    """TimeoutError is an OSError, which main() re-raises unless the disk is full; a release whose
    workers never converge must still end in one line and exit 1 (the fault is injected: a real
    one takes the convergence deadline)."""
    from unittest import mock

    never = TimeoutError("the workers did not converge on canary 2 at 10%")
    with mock.patch("aieng.release.canary_rollout.abort_canary", side_effect=never):
        result = aieng("release", "canary", "demo", "--abort", "--reason", "test", store=tmp_path / "store")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "aieng: error: timed out: the workers did not converge on canary 2 at 10%"


def test_a_server_that_does_not_answer_is_one_line_of_error_not_a_traceback(tmp_path, tiny_demo_dir):
    store = tmp_path / "store"
    assert (
        aieng("model", "register", str(tiny_demo_dir), "--name", "tiny", "--version", "1", store=store).returncode == 0
    )
    assert aieng("model", "promote", "tiny", "1", "--force", "--reason", "test", store=store).returncode == 0
    closed = f"http://127.0.0.1:{free_port()}"
    result = aieng("release", "record-answers", "tiny", "--url", closed, store=store)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"could not talk to {closed}/v1/" in result.stderr and "is the server running there" in result.stderr
    assert ModelStore(store).manifest(ModelRef("tiny", "1")).served_answers is None  # nothing recorded
    missing = aieng("release", "record-answers", "tiny", "--url", closed, "--for", "9", store=store)
    assert missing.returncode == 1 and "tiny@9 does not exist" in missing.stderr
