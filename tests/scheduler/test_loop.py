"""The engine loop driven step by step with a fake engine and a fake clock."""

import pytest
from fake_engine import FakeEngine  # noqa: E402  (tests/scheduler is on sys.path via conftest)

from aieng.engine import GenerationRequest, SamplingParams
from aieng.errors import NotReadyError
from aieng.scheduler import EngineLoop, OverloadedError, SchedulerConfig


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make(config=SchedulerConfig(max_queue_delay_ms=0)):
    clock = Clock()
    engine = FakeEngine()
    loop = EngineLoop(engine, config, clock=clock)
    return loop, engine, clock


def submit(loop, name, *, tokens=3, prompt_len=10, priority="interactive", timeout=None):
    events = []
    loop.scheduler.submit(
        GenerationRequest(name, [1] * prompt_len, SamplingParams(max_tokens=tokens)),
        events.append,
        priority=priority,
        timeout=timeout,
    )
    return events


def test_requests_join_between_steps_and_leave_when_finished():
    loop, engine, clock = make()
    a = submit(loop, "a", tokens=3)
    loop.run_once()
    b = submit(loop, "b", tokens=2)
    loop.run_once()
    assert engine.steps[1] == {"joiners": ["b"], "prompt_lengths": [10], "batch": 2}
    loop.run_once()
    assert a[-1].finished and b[-1].finished
    assert loop.scheduler.num_running == 0 and engine.num_running == 0
    assert [e.text for e in a] == ["t1 ", "t2 ", "t3 "]


def test_batch_size_is_bounded():
    loop, engine, clock = make(SchedulerConfig(max_batch_size=2, max_queue_delay_ms=0))
    for i in range(5):
        submit(loop, f"r{i}", tokens=10)
    loop.run_once()
    assert engine.steps[-1]["batch"] == 2 and loop.scheduler.num_waiting == 3


def test_full_queue_is_429_with_retry_after():
    loop, engine, clock = make(SchedulerConfig(max_queue=2, max_queue_delay_ms=0))
    submit(loop, "a")
    submit(loop, "b")
    with pytest.raises(OverloadedError) as info:
        submit(loop, "c")
    assert info.value.status == 429 and info.value.retry_after >= 1


def test_cancelled_row_leaves_within_one_step():
    loop, engine, clock = make()
    events = submit(loop, "gone", tokens=100)
    submit(loop, "stays", tokens=100)
    loop.run_once()
    loop.scheduler.cancel("gone")
    loop.run_once()
    assert engine.running_ids() == ["stays"]
    assert len(events) == 1  # nothing after the cancellation


def test_cancel_while_waiting_removes_from_queue():
    loop, engine, clock = make(SchedulerConfig(max_batch_size=1, max_queue_delay_ms=0))
    submit(loop, "running", tokens=100)
    submit(loop, "waiting", tokens=100)
    loop.run_once()
    loop.scheduler.cancel("waiting")
    loop.run_once()
    assert loop.scheduler.num_waiting == 0 and engine.running_ids() == ["running"]


def test_deadline_fails_running_and_waiting_requests_with_timeout():
    loop, engine, clock = make(SchedulerConfig(max_batch_size=1, max_queue_delay_ms=0))
    running = submit(loop, "slow", tokens=1000, timeout=1.0)
    waiting = submit(loop, "queued", tokens=5, timeout=0.5)
    loop.run_once()
    clock.now = 2.0
    loop.run_once()
    assert running[-1].finished and running[-1].error.code == "timeout"
    assert waiting[-1].error.code == "timeout" and waiting[-1].error.status == 504
    assert engine.num_running == 0


def _flood(aging_ms, steps=200, step_s=0.05):
    """Interactive load above capacity (1.25 arrivals per step, 1 completion per step) plus one batch request."""
    config = SchedulerConfig(max_batch_size=2, aging_ms=aging_ms, max_queue_delay_ms=0)
    loop, engine, clock = make(config)
    low = submit(loop, "low", priority="batch", tokens=2)
    for step in range(steps):
        for k in range(2 if step % 4 == 0 else 1):
            submit(loop, f"i{step}-{k}", tokens=2)
        loop.run_once()
        clock.now += step_s
        if low and low[-1].finished:
            break
    started = next((i for i, s in enumerate(engine.steps) if "low" in s["joiners"]), None)
    return low, started


def test_low_priority_request_finishes_under_constant_interactive_load():
    """The aging bound: a batch request starts within aging_ms plus the interactive backlog of that time."""
    low, started = _flood(aging_ms=500)
    assert low and low[-1].finished
    # it competes as an interactive request that arrived aging_ms later: ~0.5 s, plus the few
    # requests queued ahead of it by then (backlog grows 0.25 per 0.05 s step -> ~3 steps)
    assert started * 0.05 <= 0.5 + 5 * 0.05


def test_without_aging_the_same_load_starves_the_batch_request():
    low, started = _flood(aging_ms=1e12)
    assert started is None and not (low and low[-1].finished)


def test_idle_engine_waits_max_queue_delay_to_batch_a_burst():
    loop, engine, clock = make(SchedulerConfig(max_queue_delay_ms=20))
    submit(loop, "a")
    loop.run_once()
    assert engine.steps == []  # still within the delay: wait for companions
    submit(loop, "b")
    clock.now = 0.021
    loop.run_once()
    assert engine.steps[0]["joiners"] == ["a", "b"]


def test_drain_refuses_new_requests_but_finishes_running_ones():
    loop, engine, clock = make()
    events = submit(loop, "inflight", tokens=3)
    loop.run_once()
    loop.scheduler.drain()
    with pytest.raises(NotReadyError):
        submit(loop, "new")
    loop.run_once()
    loop.run_once()
    assert events[-1].finished and loop.scheduler.idle()


def test_the_thread_runs_requests_to_completion():
    import threading

    loop = EngineLoop(FakeEngine(), SchedulerConfig(max_queue_delay_ms=1)).start()
    done = threading.Event()
    events = []

    def sink(event):
        events.append(event)
        if event.finished:
            done.set()

    loop.scheduler.submit(GenerationRequest("x", [1, 2], SamplingParams(max_tokens=4)), sink)
    assert done.wait(5)
    loop.stop()
    assert [e.completion_tokens for e in events] == [1, 2, 3, 4]


def test_observers_see_a_step_before_any_client_sees_its_tokens():
    """A client that has a token can already scrape the gauges that step moved."""
    from aieng.observability.observer import StepObserver

    delivered = []
    seen_at_step = []

    class Watcher(StepObserver):
        def on_step(self, step, running, waiting, now):
            seen_at_step.append(len(delivered))

    loop = EngineLoop(FakeEngine(), SchedulerConfig(max_queue_delay_ms=0), clock=Clock(), observers=[Watcher()])
    loop.scheduler.submit(GenerationRequest("x", [1], SamplingParams(max_tokens=2)), delivered.append)
    loop.run_once()
    loop.run_once()
    assert seen_at_step == [0, 1] and len(delivered) == 2
    assert [n for _, n, _ in loop.history] == [1, 0]


def test_the_scheduler_admits_no_more_rows_than_the_engine_holds_now():
    """During a hot swap the two versions share one KV cache: the new engine holds fewer rows
    than max_batch_size until the old one finishes, and the queue waits for room (no spinning)."""
    loop, engine, clock = make(SchedulerConfig(max_batch_size=8, max_queue_delay_ms=0))
    engine.max_rows = 2
    for i in range(5):
        submit(loop, f"r{i}", tokens=10)
    loop.run_once()
    assert engine.steps[-1]["batch"] == 2 and loop.scheduler.num_waiting == 3
    engine.max_rows = 0  # e.g. the old version kept every slot: nothing may join, nothing to wake for
    loop.scheduler.running.clear()
    engine.rows.clear()
    assert not loop.scheduler.has_work(clock()) and loop.scheduler.sleep_for(clock()) is None
    engine.max_rows = 5  # the cache grew back
    loop.run_once()
    assert engine.steps[-1]["batch"] == 3 and loop.scheduler.num_waiting == 0


def test_a_call_between_steps_runs_on_the_engine_thread_and_inline_when_the_loop_is_stopped():
    import threading

    loop = EngineLoop(FakeEngine(), SchedulerConfig(max_queue_delay_ms=1)).start()
    here = threading.get_ident()
    assert loop.call_between_steps(threading.get_ident).result(timeout=5) not in (here, None)
    with pytest.raises(ZeroDivisionError):
        loop.call_between_steps(lambda: 1 / 0).result(timeout=5)  # the caller hears of a failure
    assert loop.alive
    loop.stop()
    assert not loop.alive and loop.call_between_steps(threading.get_ident).result(timeout=5) == here
