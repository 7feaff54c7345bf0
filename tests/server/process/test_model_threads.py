"""run_on_own_thread: the work's result or error comes back, and its OpenMP pool does not outlive it."""

import os
import threading
import time

import pytest
import torch

from aieng.server.process.model_threads import run_on_own_thread


def native_threads() -> set[int]:
    """This process's OS threads that are not Python threads: OpenMP's pool threads among them."""
    python = {t.native_id for t in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python


def parallel_work() -> str:
    """A kernel big enough for ATen to split it over OpenMP threads: the calling thread gets a pool."""
    torch.ones(1 << 22).add_(1.0)
    return threading.current_thread().name


def new_threads_left(before: set[int], timeout: float = 5.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while (left := native_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.02)  # a pool's threads leave shortly after their owner
    return left


def test_the_result_comes_back_from_a_thread_of_the_given_name():
    assert run_on_own_thread(parallel_work, name="aieng-test-work") == "aieng-test-work"
    assert not any(t.name == "aieng-test-work" for t in threading.enumerate())


def test_the_error_comes_back_to_the_caller():
    def fail(message):
        raise ValueError(message)

    with pytest.raises(ValueError, match="bad weights"):
        run_on_own_thread(fail, "bad weights", name="aieng-test-fail")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_no_openmp_pool_outlives_the_work_but_a_living_thread_keeps_one():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # a pool needs at least one worker beside its owner
    try:
        before = native_threads()
        run_on_own_thread(parallel_work, name="aieng-test-pool")
        assert new_threads_left(before) == set()

        # The control: the same work on a thread that lives on leaves its pool behind (what the
        # engine build on the event loop's executor thread did), so the check above can fail.
        done, release = threading.Event(), threading.Event()

        def live_on():
            parallel_work()
            done.set()
            release.wait()

        keeper = threading.Thread(target=live_on, daemon=True)
        keeper.start()
        done.wait(10)
        assert native_threads() - before  # the keeper's own pool threads
        release.set()
        keeper.join()
        assert new_threads_left(before) == set()
    finally:
        torch.set_num_threads(previous)
