"""The measured weight-format plan is kept across restarts: a second start with the same CPU,
threads and shapes takes it without timing; an unreadable file is measured over; another thread
count is another plan."""

import json
import logging

import pytest
import torch

from aieng.engine.native import formats
from aieng.engine.native.formats import measure_format_plan


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    return tmp_path / "aieng-format-plans"


@pytest.fixture
def timed(monkeypatch):
    """Counts the timings taken; the real ones run (tiny matrices, one repeat)."""
    calls = []
    real = formats._time_formats

    def counting(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(formats, "_time_formats", counting)
    return calls


def test_a_second_start_takes_the_kept_plan_without_timing(demo, cache_dir, timed, caplog):
    model, _ = demo
    first = measure_format_plan(model, repeats=1)
    assert timed == list(formats.TOKEN_COUNTS)
    [kept] = list(cache_dir.glob("*.json"))
    assert json.loads(kept.read_text())["bf16_from"] == [list(x) for x in first.bf16_from]
    timed.clear()
    with caplog.at_level(logging.INFO, logger="aieng.engine"):
        second = measure_format_plan(model, repeats=1)
    assert second == first and timed == []
    assert second.one_row_margin == pytest.approx(first.one_row_margin, rel=0.01)  # from the kept timings
    assert any(getattr(r, "cached", False) and str(kept) in r.getMessage() for r in caplog.records)
    # not cached: measured, and nothing written over the kept plan
    before = kept.read_text()
    assert measure_format_plan(model, repeats=1, cached=False).measured and timed and kept.read_text() == before


def test_an_unreadable_plan_is_measured_over_and_replaced(demo, cache_dir, timed):
    model, _ = demo
    measure_format_plan(model, repeats=1)
    [kept] = list(cache_dir.glob("*.json"))
    kept.write_text('{"bf16_from": [[1, tr')  # half a file, as a crash would leave without the rename
    timed.clear()
    plan = measure_format_plan(model, repeats=1)
    assert timed and json.loads(kept.read_text())["packed_from"] == plan.packed_from
    assert list(cache_dir.glob("*.tmp")) == []


def test_another_thread_count_is_another_plan(demo, cache_dir, timed):
    model, _ = demo
    threads = torch.get_num_threads()
    measure_format_plan(model, repeats=1)
    try:
        torch.set_num_threads(threads + 1)
        timed.clear()
        measure_format_plan(model, repeats=1)
    finally:
        torch.set_num_threads(threads)
    assert timed and len(list(cache_dir.glob("*.json"))) == 2
