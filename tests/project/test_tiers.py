"""Every collected test has exactly one cost tier, set by tests/conftest.py from what it uses, and
``make test-fast`` filters on those tiers.

The tiers: ``unit`` (no model, no server), ``model`` (builds or loads a model in the test
process), ``server`` (a real ``aieng serve`` process, its own or the session's), ``notebook`` (an
nbval cell, or a runbook run by papermill); a test that qualifies for two gets the higher
(notebook > server > model > unit).
``perf`` is not a tier: it marks a test that asserts a timing or throughput bound. What the
whole suite collects is what this session collected, or what a collection run (``--collect-only``)
writes out (``AIENG_TIERS_REPORT``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("unit", "model", "server", "notebook")
FAST = "not server and not notebook and not perf"
STARTS_A_SERVER = "ServerProcess" + "("  # split: read as a call in this file, it would make it one that starts a server


def collect(tmp_path, *paths: str) -> list[dict]:
    """A collection run of ``paths`` (``--collect-only``), as tests/conftest.py marked it."""
    report = tmp_path / "tiers.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *paths, "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env={**os.environ, "AIENG_TIERS_REPORT": str(report)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def collected(request, collected_tiers, tmp_path_factory) -> dict[str, dict]:
    """``nodeid -> {"tiers", "perf", "alone"}`` for every test of ``make test``: what this session collected
    when it collected all of tests/ (``make test``, ``make test-fast``: before ``-m`` deselected),
    else a collection run; the notebooks' cells from a collection run unless collected here."""
    rows = collected_tiers
    args = {Path(request.config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in request.config.args}
    if ROOT / "tests" not in args:  # not all of tests/ (this file alone, say)
        rows = collect(tmp_path_factory.mktemp("tiers"), "tests")
    if not any(row["nodeid"].startswith("notebooks/") for row in rows):
        cells = collect(tmp_path_factory.mktemp("tiers"), "tests/project/test_tiers.py", "--nbval-lax", "notebooks")
        rows = [*rows, *(row for row in cells if row["nodeid"].startswith("notebooks/"))]  # with the tiers' conftest
    return {row["nodeid"]: row for row in rows}


def tier(collected, nodeid: str) -> str:
    (found,) = collected[nodeid]["tiers"]
    return found


def test_every_test_has_exactly_one_cost_tier_and_every_tier_is_used(collected):
    wrong = {nodeid: row["tiers"] for nodeid, row in collected.items() if len(row["tiers"]) != 1}
    assert not wrong, f"{len(wrong)} tests without exactly one tier, e.g. {list(wrong.items())[:5]}"
    assert {row["tiers"][0] for row in collected.values()} == set(TIERS)
    assert any(row["perf"] for row in collected.values())


@pytest.mark.parametrize(
    "nodeid,expected",
    [
        ("tests/scheduler/test_policy.py::test_interactive_goes_before_batch_at_equal_wait", "unit"),  # nothing costly
        ("tests/bench/test_grammar_bench.py::test_bench_grammar_cli_reports_cost_and_effect", "model"),  # demo_store
        ("tests/evaluation/test_suite.py::test_evaluate_dir_loads_offline", "model"),  # tiny_demo_dir
        ("tests/server/http/test_routes.py::test_health_routes", "model"),  # the app in-process, no server
        ("tests/server/http/test_openai_client.py::test_completions", "server"),  # the session's server
        (
            "tests/observability/test_metrics_http.py::test_counters_add_up_across_two_workers_and_every_name_is_exported",
            "server",
        ),
        (
            "tests/server/process/test_process_model.py::test_sigterm_drains_in_flight_streams_and_exits_zero",
            "server",
        ),  # a ServerProcess started in the test's own code; demo_store too: server wins
        (
            "tests/server/process/test_startup.py::test_the_heartbeat_says_what_is_still_running_and_stops_when_ready",
            "unit",
        ),
        ("tests/bench/test_server_process.py::test_the_server_dies_when_its_owner_is_killed", "server"),  # its marker
        ("notebooks/05_batching.ipynb::Cell 0", "notebook"),
        ("tests/runbooks/test_runbooks.py::test_rollback_runbook_dry_run_then_real_then_idempotent", "notebook"),
    ],
)
def test_the_tier_follows_what_a_test_uses(collected, nodeid, expected):
    assert tier(collected, nodeid) == expected, collected[nodeid]


def test_perf_marks_timing_bounds_beside_the_tier(collected):
    row = collected["tests/evaluation/test_suite.py::test_the_demo_evaluation_takes_under_a_minute"]
    assert row["perf"] and row["tiers"] == ["model"]
    assert not collected["tests/evaluation/test_suite.py::test_demo_model_meets_the_quality_bar"]["perf"]


def test_a_perf_test_runs_alone_unless_it_judges_what_a_fixture_measured(collected):
    assert collected[
        "tests/server/process/test_slow_clients.py::test_a_reader_that_never_reads_does_not_slow_the_others"
    ]["alone"]
    for judged in (
        "tests/server/process/test_hot_swap.py::test_a_swap_does_not_stall_the_streams_it_serves",  # measured alone
        "tests/evaluation/test_suite.py::test_the_demo_evaluation_takes_under_a_minute",  # timed beside the other
    ):
        assert collected[judged]["perf"] and not collected[judged]["alone"], judged
    assert not any(row["alone"] and not row["perf"] for row in collected.values())


def test_every_file_that_starts_a_server_has_server_tests(collected):
    """A test module whose code starts ``ServerProcess`` (in a test, a fixture or a child's script)
    has its tests that do in the server tier, not in ``make test-fast``."""
    starting = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if STARTS_A_SERVER in path.read_text()
    }
    tiers_of = {}
    for nodeid, row in collected.items():
        tiers_of.setdefault(nodeid.split("::")[0], set()).update(row["tiers"])
    assert starting and all("server" in tiers_of.get(path, ()) for path in starting), {
        path: tiers_of.get(path) for path in starting
    }


def test_the_markers_are_registered_and_make_test_fast_selects_by_them():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert sorted(line.split(":")[0] for line in markers) == sorted((*TIERS, "perf"))
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^FAST_TIERS := {FAST}$", makefile, re.MULTILINE)
    recipe = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert recipe.splitlines() == ['\t$(PYTEST) tests -m "$(FAST_TIERS)" -n auto --dist loadfile --durations=10']
    everything = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert "$(PYTEST) tests -n $(TEST_WORKERS) --dist loadfile" in everything  # whole files per worker
    assert not re.search(r'\s-m\s+"', everything)  # all tiers
