import pytest

from aieng.engine import GenerationRequest, SamplingParams
from aieng.scheduler.policy import QueuedRequest, QueueFullError, SchedulerConfig, WaitingQueue


def q(request_id, prompt_len=10, priority="interactive", arrival=0.0):
    return QueuedRequest(
        GenerationRequest(request_id, [1] * prompt_len, SamplingParams()), priority=priority, arrival=arrival
    )


def test_interactive_goes_before_batch_at_equal_wait():
    queue = WaitingQueue(SchedulerConfig())
    queue.add(q("b", priority="batch"))
    queue.add(q("i", priority="interactive"))
    assert [x.request_id for x in queue.pop_joiners(0.0, 1)] == ["i"]


def test_aging_lets_a_batch_request_overtake_fresh_interactive_ones():
    config = SchedulerConfig(aging_ms=1000)
    queue = WaitingQueue(config)
    queue.add(q("old-batch", priority="batch", arrival=0.0))
    queue.add(q("fresh", priority="interactive", arrival=1.2))
    assert queue.pop_joiners(1.2, 1)[0].request_id == "old-batch"  # waited 1.2 s > one class


def test_fifo_within_a_class():
    queue = WaitingQueue(SchedulerConfig())
    for name in "abc":
        queue.add(q(name))
    assert [x.request_id for x in queue.pop_joiners(0.0, 3)] == ["a", "b", "c"]


def test_prefill_groups_by_length_bucket():
    queue = WaitingQueue(SchedulerConfig(bucket_edges=(16, 64, 256)))
    queue.add(q("short1", 10))
    queue.add(q("long", 200))
    queue.add(q("short2", 12))
    first = queue.pop_joiners(0.0, 8)
    assert [x.request_id for x in first] == ["short1", "short2"]
    assert [x.request_id for x in queue.pop_joiners(0.0, 8)] == ["long"]


def test_token_budget_limits_the_group_but_the_head_always_goes():
    config = SchedulerConfig(max_batch_tokens=100, bucket_edges=(1000,))
    queue = WaitingQueue(config)
    queue.add(q("huge", 300))
    queue.add(q("small", 20))
    assert [x.request_id for x in queue.pop_joiners(0.0, 8)] == ["huge"]
    for i in range(6):
        queue.add(q(f"s{i}", 20))
    assert len(queue.pop_joiners(0.0, 8)) == 5  # 5 × 20 = 100 padded tokens fit


def test_free_slots_bound_the_group_and_the_queue_is_bounded():
    queue = WaitingQueue(SchedulerConfig(max_queue=3))
    for i in range(3):
        queue.add(q(f"r{i}"))
    with pytest.raises(QueueFullError):
        queue.add(q("r3"))
    assert len(queue.pop_joiners(0.0, 2)) == 2 and len(queue) == 1
    assert queue.pop_joiners(0.0, 0) == []


def test_expired_requests_leave_the_queue():
    queue = WaitingQueue(SchedulerConfig())
    item = q("late")
    item.deadline = 5.0
    queue.add(item)
    queue.add(q("fine"))
    assert [x.request_id for x in queue.expired(6.0)] == ["late"]
    assert "late" not in queue and "fine" in queue
