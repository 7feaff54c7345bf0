"""The test workers' share of the machine (tests/machine_share.py): a test that measures time runs
alone, no worker's next test slips in ahead of one waiting to be alone, and two workers that both
want to be alone do not wait on each other forever. Two ``MachineShare`` objects in one process
open the lock files separately, so they contend as two workers do."""

from __future__ import annotations

import threading
import uuid

from ..machine_share import MachineShare


def workers(n: int) -> list[MachineShare]:
    run = uuid.uuid4().hex
    shares = [MachineShare() for _ in range(n)]
    for share in shares:
        share.configure(run)
    return shares


def in_thread(claim, entered: threading.Event, leave: threading.Event, log: list, name: str) -> threading.Thread:
    def body():
        with claim():
            log.append(name)
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def a_shared_test_running():
    """Three workers; the first in a shared claim until ``events["a_out"]`` is set."""
    shares = workers(3)
    log, events = [], {k: threading.Event() for k in ("a_in", "a_out", "b_in", "b_out", "c_in", "c_out")}
    in_thread(shares[0].shared, events["a_in"], events["a_out"], log, "a")
    assert events["a_in"].wait(10)
    return shares, log, events


def test_alone_waits_for_the_other_workers_test_and_shared_claims_run_together():
    (a, b, c), log, events = a_shared_test_running()
    in_thread(c.shared, events["c_in"], events["c_out"], log, "c")
    assert events["c_in"].wait(10)  # two shared claims at once
    in_thread(b.alone, events["b_in"], events["b_out"], log, "b")
    assert not events["b_in"].wait(0.3)  # alone waits while the others run
    events["a_out"].set()
    assert not events["b_in"].wait(0.3)
    events["c_out"].set()
    assert events["b_in"].wait(10)
    events["b_out"].set()


def test_a_worker_waiting_to_be_alone_goes_before_the_next_shared_test():
    (a, b, c), log, events = a_shared_test_running()
    in_thread(b.alone, events["b_in"], events["b_out"], log, "b")
    assert not events["b_in"].wait(0.3)
    in_thread(c.shared, events["c_in"], events["c_out"], log, "c")
    assert not events["c_in"].wait(0.3)  # held at the turnstile behind b
    events["a_out"].set()
    assert events["b_in"].wait(10) and not events["c_in"].is_set()
    events["b_out"].set()
    assert events["c_in"].wait(10)
    events["c_out"].set()
    assert log == ["a", "b", "c"]


def test_a_long_shared_claim_lets_a_worker_waiting_to_be_alone_in_at_its_breaks():
    (a, b, c), log, events = a_shared_test_running()
    in_thread(b.alone, events["b_in"], events["b_out"], log, "b")
    assert not events["b_in"].wait(0.3)  # a's claim holds
    in_break = threading.Thread(target=a.let_waiting_in, daemon=True)
    in_break.start()
    assert events["b_in"].wait(10)  # b runs in a's break ...
    assert in_break.is_alive()  # ... and a goes on once b is done
    events["b_out"].set()
    in_break.join(10)
    assert not in_break.is_alive() and a.mode == "shared"
    in_thread(c.alone, events["c_in"], events["c_out"], log, "c")
    assert not events["c_in"].wait(0.3)  # a holds its shared claim again
    events["a_out"].set()
    assert events["c_in"].wait(10)
    events["c_out"].set()


def test_a_break_without_a_worker_waiting_goes_straight_on():
    a, b = workers(2)
    with a.shared():
        in_break = threading.Thread(target=a.let_waiting_in, daemon=True)
        in_break.start()
        in_break.join(10)
        assert not in_break.is_alive() and a.mode == "shared"
        log, entered, leave = [], threading.Event(), threading.Event()
        in_thread(b.shared, entered, leave, log, "b")
        assert entered.wait(10)  # a shared claim still: another runs beside it
        leave.set()


def test_two_workers_that_both_want_to_be_alone_inside_a_test_each_get_a_turn():
    a, b = workers(2)
    turns, ready = [], threading.Barrier(2)

    def worker(share, name):
        with share.shared():
            ready.wait(10)  # both hold a shared claim, then both ask to be alone
            with share.alone():
                assert share.mode == "alone"
                turns.append(name)
            assert share.mode == "shared"  # back to the claim it had

    threads = [threading.Thread(target=worker, args=(s, n), daemon=True) for s, n in ((a, "a"), (b, "b"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(turns) == ["a", "b"] and not any(t.is_alive() for t in threads)


def test_outside_xdist_every_claim_is_free():
    share = MachineShare()
    with share.alone(), share.shared():
        assert share.mode is None
