"""A server a lesson starts is stopped when a later cell fails, and every lesson that starts one
without a ``with`` block says so (``stop_on_failed_cell``): no server outlives a failed lesson."""

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from aieng.workbook.servers import stop_on_failed_cell

ROOT = Path(__file__).resolve().parents[2]


class FakeEvents:
    def __init__(self):
        self.callbacks = []

    def register(self, name, callback):
        assert name == "post_run_cell"
        self.callbacks.append(callback)

    def unregister(self, name, callback):
        self.callbacks.remove(callback)

    def cell(self, error=None):
        for callback in list(self.callbacks):
            callback(SimpleNamespace(error_in_exec=error, error_before_exec=None))


@pytest.fixture
def server():
    process = subprocess.Popen(["sleep", "60"])

    def stop():
        process.terminate()
        return process.wait(10)

    yield SimpleNamespace(process=process, stop=stop, base_url="http://127.0.0.1:1")
    if process.poll() is None:
        process.kill()
        process.wait()


def test_a_failed_cell_stops_the_server_and_a_good_one_does_not(server, capsys):
    ipython = SimpleNamespace(events=FakeEvents())
    assert stop_on_failed_cell(server, ipython) is server
    ipython.events.cell()  # a cell that ran fine
    assert server.process.poll() is None
    ipython.events.cell(error=RuntimeError("an assert of the lesson"))
    assert server.process.poll() is not None and not ipython.events.callbacks
    assert "the server at http://127.0.0.1:1 was stopped" in capsys.readouterr().out


def test_outside_ipython_it_changes_nothing(server):
    assert stop_on_failed_cell(server) is server and server.process.poll() is None


def test_every_lesson_that_starts_a_server_across_cells_stops_it_on_a_failed_cell():
    started = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "runbooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            code = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            for statement in re.findall(
                r"=\s*(?:stop_on_failed_cell\()?ServerProcess\((?:[^()]|\([^()]*\))*\)\.start\(\)", code
            ):
                started.append((notebook.name, statement.lstrip("= ").startswith("stop_on_failed_cell(")))
    assert started, "the pattern found no server: the check would pass vacuously"
    assert [name for name, guarded in started if not guarded] == []


def test_a_child_listening_on_a_port_is_a_server_still_running_until_it_stops():
    import subprocess
    import sys

    from aieng.workbook.servers import servers_still_running

    before = servers_still_running()  # the session's shared server, when a test before started it
    listener = subprocess.Popen(
        [sys.executable, "-c", "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen();"
         "print(s.getsockname()[1], flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = listener.stdout.readline().strip()
        left = [entry for entry in servers_still_running() if entry not in before]
        assert len(left) == 1 and left[0].startswith(f"pid {listener.pid} ") and left[0].endswith(f"on {port}")
    finally:
        listener.kill()
        listener.wait()
    assert servers_still_running() == before
