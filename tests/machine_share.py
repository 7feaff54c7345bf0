"""One machine, two test workers: what measures time gets the machine alone.

``make test`` runs the suite on two pytest-xdist workers. Every test holds a shared claim on the
machine while it runs, setup to teardown (``tests/conftest.py``); a test that asserts a timing or
throughput bound (marked ``perf``; ``perf(alone=False)`` where it only judges what a fixture
measured already), or a fixture or lesson cell that measures one (``machine.alone()``), takes it
alone: the other worker finishes its current test and waits, so
the measurement is made on a quiet machine, as a benchmark would be. Outside xdist every claim is
a no-op.

Two ``flock`` files: ``machine`` (shared or exclusive) and ``turnstile``, which a worker that waits
to be alone holds, so that the other worker's next test cannot slip in ahead of it. A shared
claim is given up before waiting for an exclusive one, so two workers that both want to be alone
never hold what the other waits for.
"""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from pathlib import Path


class MachineShare:
    def __init__(self) -> None:
        self._machine = self._turnstile = None
        self.mode: str | None = None  # None, "shared" or "alone"

    def configure(self, run_id: str) -> None:
        """Claims from now on are real, on lock files named for this test run."""
        folder = Path(tempfile.gettempdir()) / f"aieng-test-machine-{run_id}"
        folder.mkdir(exist_ok=True)
        self._machine = open(folder / "machine", "a")  # noqa: SIM115 (held for the session)
        self._turnstile = open(folder / "turnstile", "a")  # noqa: SIM115

    @contextlib.contextmanager
    def shared(self):
        """Run beside the other worker (unless a claim is held already)."""
        if self._machine is None or self.mode is not None:
            yield
            return
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # waits while the other worker waits to be alone
        fcntl.flock(self._machine, fcntl.LOCK_SH)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self.mode = "shared"
        try:
            yield
        finally:
            fcntl.flock(self._machine, fcntl.LOCK_UN)
            self.mode = None

    def let_waiting_in(self) -> None:
        """A break inside a long shared claim (the book, page after page, cell after cell): a worker
        waiting to be alone gets its turn now, rather than when the claim ends; without one
        waiting, this takes no time."""
        if self._machine is None or self.mode != "shared":
            return
        fcntl.flock(self._machine, fcntl.LOCK_UN)
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # held by the waiting worker until it is done
        fcntl.flock(self._machine, fcntl.LOCK_SH)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self):
        """Run with the other worker idle: for what measures time. Inside a shared claim, the claim
        is given up while waiting and taken back after."""
        if self._machine is None or self.mode == "alone":
            yield
            return
        before = self.mode
        if before == "shared":
            fcntl.flock(self._machine, fcntl.LOCK_UN)
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        fcntl.flock(self._machine, fcntl.LOCK_EX)
        self.mode = "alone"
        try:
            yield
        finally:
            fcntl.flock(self._machine, fcntl.LOCK_SH if before == "shared" else fcntl.LOCK_UN)
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            self.mode = before


#: This worker's share of the machine.
machine = MachineShare()
