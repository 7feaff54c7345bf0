"""The book's per-cell hook: ``around_cell(page, cell)`` is entered as each code cell starts and
left once it has run, a failing cell included, so a claim taken for one cell never outlives it."""

from __future__ import annotations

import contextlib

import nbformat
import pytest

from aieng.workbook.book import MEASURES_TAG, BookConfig, Page, execute

pytestmark = pytest.mark.notebook  # starts a kernel


def notebook(tmp_path, *cells: tuple[str, list[str]]) -> Page:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a page")]
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    path = tmp_path / "page.ipynb"
    nbformat.write(nb, path)
    return Page("page", "runbook", str(path))  # a runbook: no server check appended


def recording(events: list):
    def around_cell(page, cell):
        @contextlib.contextmanager
        def claim():
            events.append(("enter", cell.source, MEASURES_TAG in cell.metadata.get("tags", ())))
            yield
            events.append(("leave", cell.source))

        return claim()

    return around_cell


def test_each_code_cell_runs_inside_its_own_claim_tags_and_all(tmp_path):
    page = notebook(tmp_path, ("x = 1", []), ("y = x + 1", [MEASURES_TAG]), ("print(y)", []))
    events = []
    execute(page, tmp_path / "out", BookConfig(out=tmp_path / "out"), around_cell=recording(events))
    assert page.status == "ok", page.error
    assert events == [
        ("enter", "x = 1", False),
        ("leave", "x = 1"),
        ("enter", "y = x + 1", True),
        ("leave", "y = x + 1"),
        ("enter", "print(y)", False),
        ("leave", "print(y)"),
    ]


def test_a_failing_cell_leaves_its_claim_and_the_page_records_the_failure(tmp_path):
    page = notebook(tmp_path, ("raise ValueError('on purpose')", [MEASURES_TAG]), ("never = 1", []))
    events = []
    execute(page, tmp_path / "out", BookConfig(out=tmp_path / "out"), around_cell=recording(events))
    assert page.status == "failed" and "on purpose" in page.error
    assert events == [("enter", "raise ValueError('on purpose')", True), ("leave", "raise ValueError('on purpose')")]
