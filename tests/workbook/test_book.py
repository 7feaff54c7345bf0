"""``make book`` for real: every lesson and every runbook's dry run executes (this is the suite's
run of the notebooks), the built pages read right in headless Chromium, and JupyterLab opens a
lesson on the project's kernel and runs its first cells."""

from __future__ import annotations

import contextlib
import re

import pytest

from aieng.workbook.book import MEASURES_TAG, BookConfig, build, chapters, prepared
from aieng.workbook.book_browser import check_book, check_lab

from ..machine_share import machine

pytestmark = pytest.mark.notebook
PAGES = [page.name for page in chapters(BookConfig())]
#: Lessons with cells that judge times measured one after another, tagged ``measures-time``: a
#: canary's p99 against stable's (08), both read from few requests and coarse histogram buckets.
#: Those cells run with the other test worker idle. The other lessons' bounds hold beside it: 05's
#: and 02's are throughput ratios with wide margins (a server of one torch thread), 04 times its
#: batch sizes in interleaved rounds (``ms_per_step_by_batch``), and 03 holds a warm first request
#: to a twentieth of what compiling costs a cold one (seconds against milliseconds, in processes of
#: one torch thread that a neighbour slows by a few milliseconds, not by the compile).
JUDGE_LATENCY = {"08_canary_release"}


def around_cell(page, cell):
    """A cell that measures times runs alone; before any other, a worker waiting to be alone goes
    first (the book is one long fixture: without these breaks it would wait for the whole book)."""
    if MEASURES_TAG in cell.metadata.get("tags", ()):
        return machine.alone()
    machine.let_waiting_in()
    return contextlib.nullcontext()


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    record = build(BookConfig(out=out), around_cell=around_cell)
    return out, {page["name"]: page for page in record["pages"]}


def test_the_cells_that_judge_latency_are_tagged_to_run_alone():
    measuring = {
        page.name: sum(MEASURES_TAG in cell.metadata.get("tags", ()) for cell in prepared(page).cells)
        for page in chapters(BookConfig())
    }
    assert {name for name, cells in measuring.items() if cells} == JUDGE_LATENCY, measuring


@pytest.mark.parametrize("name", PAGES)
def test_every_lesson_and_runbook_executes(book, name):
    page = book[1][name]
    assert page["status"] == "ok", f"{name} raised: {page['error']} (executed copy: {page['executed']})"


def test_the_index_lists_every_page_in_reading_order_with_where_it_ran(book):
    out, _ = book
    index = (out / "index.html").read_text()
    assert re.findall(r"href='([\w]+)\.html'", index) == PAGES
    assert "cores, torch" in index and "at commit" in index


def test_a_runbook_page_lists_its_parameters_and_what_each_step_checks(book):
    text = (book[0] / "deploy_model.html").read_text()
    assert "At a glance" in text and "this dry run" in text
    assert "Evaluate and gate" in text and "pass the release gate" in text


def test_the_book_reads_right_in_a_browser_and_keeps_screenshots(book, chromium):
    out, _ = book
    report = check_book(out, screenshots=out / "screenshots")
    assert set(report) == {"index", *PAGES}
    assert not {page: problems for page, problems in report.items() if problems}
    for name in ("index.png", "05_batching.png", "05_batching-plot.png"):
        assert (out / "screenshots" / name).stat().st_size > 1000, name


def test_a_lesson_opens_on_the_aieng_kernel_in_jupyterlab_and_runs_its_first_cells(chromium):
    assert check_lab("01_process_setup.ipynb", cells=4) == []
