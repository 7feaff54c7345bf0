"""The book's checks can fail: pages made by the book's own renderer from notebooks with a cell that
raised, a drawing cell with no picture and a picture that does not load are each reported, and a
good page is not; a lesson gets its drawing cells tagged and the server check appended."""

from __future__ import annotations

import base64
import io

import nbformat
import pytest

from aieng.workbook.book import Page, prepared
from aieng.workbook.book_browser import check_book
from aieng.workbook.book_pages import CHECK_TAG, PLOT_TAG, render_index, render_page

MADE = {"date": "2026-01-01 00:00 UTC", "host": "h", "cpu": "c", "cores": 2, "torch": "t", "commit": "abc"}


def _png() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [1, 0])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _page(tmp_path, name: str, outputs: list, *, draws: bool = True) -> Page:
    cell = nbformat.v4.new_code_cell("fig, ax = plt.subplots()" if draws else "x = 1", outputs=outputs)
    if draws:
        cell.metadata["tags"] = [PLOT_TAG]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}"), cell])
    executed = tmp_path / "executed" / f"{name}.ipynb"
    executed.parent.mkdir(exist_ok=True)
    nbformat.write(nb, executed)
    return Page(name, "lesson", str(executed), executed=str(executed), status="ok", plots=int(draws))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    picture = nbformat.v4.new_output("display_data", data={"image/png": _png(), "text/plain": "<Figure>"})
    broken = nbformat.v4.new_output("display_data", data={"text/html": "<img src='missing.png'>"})
    raised = nbformat.v4.new_output(
        "error", ename="ModuleNotFoundError", evalue="No module named 'nope'",
        traceback=["Traceback (most recent call last)", "ModuleNotFoundError: No module named 'nope'"],
    )  # fmt: skip
    pages = [
        _page(out, "good", [picture]),
        _page(out, "no_picture", [nbformat.v4.new_output("stream", name="stdout", text="drew nothing\n")]),
        _page(out, "raised", [raised], draws=False),
        _page(out, "broken_image", [broken], draws=False),
    ]
    for page in pages:
        render_page(page, out, MADE, (None, None))
    from dataclasses import asdict

    render_index({**MADE, "seconds": 1.0, "pages": [asdict(p) for p in pages]}, out)
    return out


def test_the_browser_check_reports_what_a_reader_would_see_wrong(site, chromium):
    report = check_book(site)
    assert report["good"] == [] and report["index"] == []
    assert report["no_picture"] == ["drawing cells [1] (of 1) show no picture"]
    assert "shows 'Traceback (most recent call last)'" in report["raised"]
    assert "shows 'ModuleNotFoundError'" in report["raised"]
    assert report["broken_image"] == ["1 of 1 images did not load"]


def test_a_lesson_is_prepared_with_its_drawing_cells_tagged_and_the_server_check_last():
    from aieng.workbook.book import NOTEBOOKS_DIR

    page = Page("05_batching", "lesson", str(NOTEBOOKS_DIR / "05_batching.ipynb"))
    nb = prepared(page)
    tagged = [c for c in nb.cells if PLOT_TAG in c.metadata.get("tags", [])]
    assert page.plots == len(tagged) >= 3 and all("plt.subplots(" in c.source for c in tagged)
    assert CHECK_TAG in nb.cells[-1].metadata["tags"] and "servers_still_running()" in nb.cells[-1].source
