"""A short soak against a real 2-worker server (the session's: the soak must leave it as it found
it, which is what its checks say): streamed and whole replies, hang-ups, expired deadlines and
400s mixed, then the post-run checks (memory, nothing left running, /metrics agree).

The long soak (20,000 requests) is the documented command in docs/loadtest.md; this one keeps
its shape at a few hundred requests so it fits in ``make test``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from aieng.loadtest.run import LoadTest, run_loadtest
from aieng.loadtest.workload import load_workload


@pytest.mark.timeout(300)
def test_a_short_soak_ends_every_request_as_meant_and_leaves_the_server_as_it_found_it(shared_server, tmp_path):
    workload = load_workload("soak")
    workload = replace(workload, duration_s=16.0, warmup_s=3.0, cooldown_s=1.0).with_arrival(rate=20.0)
    data = run_loadtest(
        LoadTest(url=shared_server.base_url, workload=workload, out=tmp_path, progress=False), log=lambda line: None
    )
    checks = {c["name"]: c for c in data["checks"]}
    assert all(c["passed"] for c in checks.values()), checks
    summary = data["levels"][0]["summary"]
    outcomes = summary["all"]["outcomes"]
    assert summary["all"]["failed"] == 0, outcomes
    assert {"ok", "cancelled", "timeout", "rejected"} <= set(outcomes), outcomes  # every ending happened
    assert summary["classes"]["hang_up"]["outcomes"] == {"cancelled": summary["classes"]["hang_up"]["requests"]}
    assert set(summary["classes"]["invalid"]["outcomes"]) == {"rejected"}
    assert summary["classes"]["whole"]["ok"] == summary["classes"]["whole"]["requests"]
    assert len(data["rss_samples"]) >= 4  # memory was watched during the run, not only before and after
