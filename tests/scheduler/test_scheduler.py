"""The scheduler's two calls, driven by hand with no engine at all (the way vLLM tests its own):
``schedule(now)`` says what the next step does, ``update(step, now)`` turns its events into
deliveries and stamps each request's timings."""

from aieng.engine import GenerationRequest, SamplingParams, StepResult, TokenEvent
from aieng.errors import AiengError
from aieng.observability.observer import StepObserver
from aieng.scheduler import Scheduler, SchedulerConfig


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make(**config):
    clock = Clock()
    return Scheduler(SchedulerConfig(max_queue_delay_ms=0, **config), clock=clock), clock


def submit(scheduler, name, *, tokens=3, prompt_len=4, timeout=None):
    return scheduler.submit(
        GenerationRequest(name, [1] * prompt_len, SamplingParams(max_tokens=tokens)),
        lambda event: None,
        timeout=timeout,
    )


def token(name, n, *, finished=False):
    return TokenEvent(name, n, f"t{n}", finished=finished, finish_reason="length" if finished else None)


def test_schedule_admits_waiting_requests_and_names_no_one_leaving():
    scheduler, clock = make()
    submit(scheduler, "a")
    submit(scheduler, "b")
    plan = scheduler.schedule(clock())
    assert [r.request_id for r in plan.requests] == ["a", "b"] and plan.leaving == [] and plan.failed == []
    assert plan.runs_engine and scheduler.num_running == 2 and scheduler.num_waiting == 0


def test_nothing_to_do_does_not_run_the_engine():
    scheduler, clock = make()
    plan = scheduler.schedule(clock())
    assert not plan.runs_engine and plan.requests == []


def test_update_delivers_in_order_stamps_stats_and_retires_finished_rows():
    scheduler, clock = make()
    a, b = submit(scheduler, "a"), submit(scheduler, "b")
    clock.now = 0.5
    scheduler.schedule(clock())
    clock.now = 0.7
    step = StepResult([token("a", 1), token("b", 1, finished=True)], prefill_s=0.2, decode_s=0.01, decoded_rows=2)
    deliveries = scheduler.update(step, clock())
    assert [(q.request_id, e.token_id) for q, e in deliveries] == [("a", 1), ("b", 1)]
    assert list(scheduler.running) == ["a"]
    assert (b.stats.admitted_at, b.stats.prefill_s, b.stats.first_token_at, b.stats.finished_at) == (0.5, 0.2, 0.7, 0.7)
    assert b.stats.log_fields() == {"queue_s": 0.5, "prefill_s": 0.2, "decode_s": 0.0}
    assert a.stats.finished_at is None and "decode_s" not in a.stats.log_fields()
    clock.now = 0.8  # the next step: no joiners, so nobody's prefill time is overwritten
    scheduler.schedule(clock())
    scheduler.update(StepResult([token("a", 2)], decode_s=0.01, decoded_rows=1), clock())
    assert a.stats.prefill_s == 0.2 and a.stats.first_token_at == 0.7


def test_a_cancelled_running_request_leaves_and_its_late_events_are_dropped():
    scheduler, clock = make()
    submit(scheduler, "gone")
    submit(scheduler, "stays")
    scheduler.schedule(clock())
    scheduler.cancel("gone")
    plan = scheduler.schedule(clock())
    assert plan.leaving == ["gone"] and plan.runs_engine and list(scheduler.running) == ["stays"]
    deliveries = scheduler.update(
        StepResult([token("gone", 2), token("stays", 2)], decode_s=0.01, decoded_rows=2), clock()
    )
    assert [q.request_id for q, _ in deliveries] == ["stays"]


def test_deadlines_fail_waiting_requests_without_running_and_running_ones_leave():
    scheduler, clock = make(max_batch_size=1)
    submit(scheduler, "running", timeout=1.0)
    submit(scheduler, "waiting", timeout=0.5)
    scheduler.schedule(clock())
    clock.now = 2.0
    plan = scheduler.schedule(clock())
    assert plan.leaving == ["running"]
    assert {q.request_id: e.error.code for q, e in plan.failed} == {"waiting": "timeout", "running": "timeout"}
    assert all(e.finished and e.error.status == 504 for _, e in plan.failed)
    assert scheduler.idle()


def test_fail_running_ends_every_running_request_with_the_error():
    scheduler, clock = make()
    submit(scheduler, "a")
    submit(scheduler, "b")
    scheduler.schedule(clock())
    leaving, deliveries = scheduler.fail_running(AiengError("boom"))
    assert sorted(leaving) == ["a", "b"] and scheduler.num_running == 0
    assert all(e.finished and e.finish_reason == "error" and e.error.message == "boom" for _, e in deliveries)


def test_observers_hear_admit_step_and_idle_in_that_order():
    heard = []

    class Recorder(StepObserver):
        def on_admit(self, queued, now):
            heard.append(("admit", queued.request_id))

        def on_step(self, step, running, waiting, now):
            heard.append(("step", running, waiting))

        def on_idle(self, waiting, now):
            heard.append(("idle", waiting))

    clock = Clock()
    scheduler = Scheduler(SchedulerConfig(max_queue_delay_ms=0, max_batch_size=1), clock=clock, observers=[Recorder()])
    submit(scheduler, "a")
    submit(scheduler, "b")
    scheduler.schedule(clock())
    scheduler.update(StepResult([token("a", 1, finished=True)], prefill_s=0.1, decode_s=0.0, decoded_rows=1), clock())
    assert heard == [("admit", "a"), ("step", 0, 1), ("idle", 1)]


def test_retry_after_is_the_time_the_queue_takes_to_drain_at_the_recent_completion_rate():
    scheduler, clock = make(max_batch_size=4, max_queue=8)
    assert scheduler.retry_after(clock()) == 1  # nothing finished yet: no rate to go on
    for i in range(4):
        submit(scheduler, f"r{i}", tokens=1)
    scheduler.schedule(clock())
    clock.now = 2.0  # 4 completions in 2 s: 2 requests/s
    scheduler.update(
        StepResult([token(f"r{i}", 1, finished=True) for i in range(4)], decode_s=0.1, decoded_rows=4), clock()
    )
    for i in range(8):
        submit(scheduler, f"w{i}")
    assert scheduler.retry_after(clock()) == 4  # 8 waiting at 2 per s
    try:
        submit(scheduler, "one-too-many")
    except AiengError as exc:
        assert exc.status == 429 and exc.retry_after == 4 and "retry in 4 s" in exc.message
    else:
        raise AssertionError("a full queue must refuse")
    clock.now = 40.0  # nothing finished since: the engine looks stalled, the hint grows (capped at 60)
    assert scheduler.retry_after(clock()) == 60


def test_server_timing_names_each_phase_that_happened_in_milliseconds():
    scheduler, clock = make()
    a = submit(scheduler, "a")
    assert a.stats.server_timing() == ""
    clock.now = 0.25
    scheduler.schedule(clock())
    clock.now = 0.5
    scheduler.update(
        StepResult([token("a", 1, finished=True)], prefill_s=0.125, decode_s=0.01, decoded_rows=1), clock()
    )
    assert a.stats.server_timing() == "queue;dur=250.0, prefill;dur=125.0, decode;dur=0.0"
