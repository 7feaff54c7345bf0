import random

from aieng.scheduler.padding import padding_waste
from aieng.scheduler.policy import SchedulerConfig


def test_buckets_cut_padding_waste_on_mixed_lengths():
    rng = random.Random(0)
    lengths = [rng.choice([rng.randint(5, 15), rng.randint(200, 400)]) for _ in range(64)]
    config = SchedulerConfig(max_batch_size=16, max_batch_tokens=10**6)
    with_buckets = padding_waste(lengths, config, bucketed=True)
    without = padding_waste(lengths, config, bucketed=False)
    assert with_buckets["real_tokens"] == without["real_tokens"] == sum(lengths)
    assert with_buckets["waste"] < 0.5 * without["waste"]


def test_uniform_lengths_have_no_waste():
    assert padding_waste([32] * 10, SchedulerConfig())["waste"] == 0.0
