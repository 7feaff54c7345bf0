"""``make book``: the workbook as a site a reader can browse before running anything.

Every lesson in ``notebooks/`` is executed in reading order and every runbook in ``runbooks/`` is
executed as a dry run against a temporary store and server, then each executed copy becomes one
HTML page (``aieng.workbook.book_pages``) and an index lists them in reading order. The pages show
the numbers and plots of the machine that built them, and say when, where and at which commit.

Why nbconvert and not Jupyter Book: it is already installed with JupyterLab and renders a notebook
with JupyterLab's own stylesheet and output renderers, so a page looks like the lesson in the lab;
Jupyter Book would add a Sphinx (or Node) tool chain for a table of contents we write in a page.

The executed copies and the site are build outputs (``var/book/``, git-ignored): the notebooks in
the repository stay output-free. A page whose notebook raised is still written, with its error,
and the build exits non-zero naming it. ``book.json`` records every page (status, seconds, plots
expected), which the browser check (``aieng.workbook.book_browser``) reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

from aieng.workbook.book_pages import CHECK_TAG, PLOT_TAG
from aieng.workbook.paths import PROJECT_ROOT, store_root

NOTEBOOKS_DIR = PROJECT_ROOT / "notebooks"
RUNBOOKS_DIR = PROJECT_ROOT / "runbooks"
#: The runbooks in the order an operator meets them: ship, check, widen, measure, diagnose, undo.
RUNBOOK_ORDER = ("deploy_model", "warmup_verify", "canary_release", "load_test", "incident_triage", "rollback")
#: A code cell that makes a matplotlib figure, or displays an image at its top level, must show a
#: picture on its page; the build tags it so the browser check can look for it.
DRAWS = re.compile(r"plt\.(subplots|figure)\(|^display\(Image\(", re.MULTILINE)
#: Appended to every lesson: the runtime half of "a lesson stops every server it starts".
SERVER_CHECK = (
    "# Added by the book build: a lesson stops every server it starts, so none is running now.\n"
    "from aieng.workbook.servers import servers_still_running\n"
    "left = servers_still_running()\n"
    'assert not left, f"servers this lesson started are still running: {left}"\n'
    'print("no server started by this lesson is still running")'
)
#: A lesson's cell that measures times and asserts on them: its numbers mean something on a quiet
#: machine only (the test suite runs it with the other test worker idle).
MEASURES_TAG = "measures-time"
#: ``around_cell(page, cell)``: a context entered around one code cell's execution.
AroundCell = Callable[["Page", dict], ContextManager]


@dataclass(frozen=True)
class BookConfig:
    """What ``make book`` builds, and where."""

    out: Path = PROJECT_ROOT / "var" / "book"
    notebooks: tuple[str, ...] = ()  # notebook stems to build (``05_batching``); empty: all
    runbooks: tuple[str, ...] | None = None  # runbook stems; None: all, () none
    kernel_name: str = "python3"
    cell_timeout_s: int = 900  # a cell running longer is an error on its page


@dataclass
class Page:
    """One chapter of the book: its source, its executed copy and its HTML page."""

    name: str
    kind: str  # "lesson" or "runbook"
    source: str
    title: str = ""
    executed: str = ""
    html: str = ""
    seconds: float = 0.0
    status: str = "pending"  # "ok" or "failed"
    error: str = ""
    plots: int = 0  # cells tagged as drawing a picture
    parameters: dict = field(default_factory=dict)


def chapters(config: BookConfig) -> list[Page]:
    """The pages in reading order: the lessons by number, then the runbooks."""
    lessons = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    if config.notebooks:
        unknown = set(config.notebooks) - {p.stem for p in lessons}
        if unknown:
            raise SystemExit(f"no such notebook: {', '.join(sorted(unknown))} (see {NOTEBOOKS_DIR})")
        lessons = [p for p in lessons if p.stem in config.notebooks]
    runbooks = RUNBOOK_ORDER if config.runbooks is None else config.runbooks
    unknown = set(runbooks) - set(RUNBOOK_ORDER)
    if unknown:
        raise SystemExit(f"no such runbook: {', '.join(sorted(unknown))} (one of {', '.join(RUNBOOK_ORDER)})")
    pages = [Page(p.stem, "lesson", str(p)) for p in lessons]
    return pages + [Page(name, "runbook", str(RUNBOOKS_DIR / f"{name}.ipynb")) for name in runbooks]


def prepared(page: Page):
    """The notebook to execute: drawing cells tagged, and a lesson's server check appended."""
    import nbformat

    nb = nbformat.read(page.source, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and DRAWS.search(cell.source):
            cell.metadata.setdefault("tags", []).append(PLOT_TAG)
            page.plots += 1
    if page.kind == "lesson":
        check = nbformat.v4.new_code_cell(SERVER_CHECK)
        check.metadata["tags"] = [CHECK_TAG]
        nb.cells.append(check)
    return nb


def execute(
    page: Page, out: Path, config: BookConfig, parameters: dict | None = None, around_cell: AroundCell | None = None
) -> None:
    """Run the page's notebook with papermill into ``out/executed/``; a failure is recorded on the
    page (and its executed copy kept, error included), not raised. ``around_cell(page, cell)`` is
    entered as each code cell starts and left when it has run (or when the page ends, if it never
    finished)."""
    import papermill

    nb = prepared(page)
    executed = out / "executed" / f"{page.name}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    page.executed, page.parameters = str(executed), parameters or {}
    started = time.perf_counter()
    with contextlib.ExitStack() as cell_claim:
        hooks = {}
        if around_cell is not None:
            # nbclient's hooks: on_cell_execute before the cell is sent, on_cell_executed after its reply
            hooks = {
                "on_cell_execute": lambda cell, cell_index: cell_claim.enter_context(around_cell(page, cell)),
                "on_cell_executed": lambda cell, cell_index, execute_reply: cell_claim.close(),
            }
        try:
            papermill.execute_notebook(
                nb,
                str(executed),
                parameters=parameters,
                kernel_name=config.kernel_name,
                cwd=str(Path(page.source).parent),
                progress_bar=False,
                execution_timeout=config.cell_timeout_s,
                **hooks,
            )
            page.status = "ok"
        except Exception as exc:  # papermill's execution error, a dead kernel, a timeout: all go on the page
            page.status = "failed"
            message = f"{type(exc).__name__}: {getattr(exc, 'ename', '')} {getattr(exc, 'evalue', exc)}"
            page.error = message.strip()[:500]
    page.seconds = round(time.perf_counter() - started, 1)


@contextlib.contextmanager
def runbook_stage(source_store: Path):
    """A temporary store and server for the runbooks' dry runs, so the book changes nothing real:
    demo@1 promoted then demo@2 (so a rollback has a target), demo@3 a candidate for the canary;
    the server serves the store's current version with one worker."""
    from aieng.bench.server_process import ServerProcess
    from aieng.store import ModelRef, ModelStore

    source = ModelStore(source_store).path(ModelRef("demo"))
    token = secrets.token_hex(16)  # the admin API's, for the runbooks' hot-swap pre-checks
    # in this process's environment, so the kernels papermill starts inherit it; put back after
    with tempfile.TemporaryDirectory(prefix="aieng-book-") as tmp, mock.patch.dict(os.environ, AIENG_ADMIN_TOKEN=token):
        store = ModelStore(Path(tmp) / "store")
        for version in ("1", "2", "3"):
            store.register(source, "demo", version, provenance="the book's stage")
        store.promote("demo", "1", reason="book stage")
        store.promote("demo", "2", reason="book stage")
        env = {"AIENG_ADMIN_TOKEN": token}
        with ServerProcess(store=store.root, model="demo", extra_args=["--workers", "1"], env=env) as server:
            yield store.root, server.base_url, source


def runbook_parameters(name: str, store: Path, url: str, source: Path) -> dict:
    """Each runbook's dry run on the stage: what it would do, against real state."""
    common = {"store": str(store)}
    return {
        "deploy_model": {**common, "source": str(source), "name": "demo", "version": "4", "server_url": url},
        "warmup_verify": {"base_url": url, "expected_model": "demo@2"},
        "canary_release": {**common, "version": "3", "server_url": url},
        "load_test": {"server_url": url},
        "incident_triage": {**common, "base_url": url, "window_s": 5},
        "rollback": {**common, "name": "demo", "server_url": url},
    }[name]


def build(config: BookConfig, around_cell: AroundCell | None = None) -> dict:
    """Execute every page, render the site and return its record (also written to ``book.json``).

    ``around_cell(page, cell)``, when given, is entered around each code cell's execution: the
    test suite uses it to give the cells tagged ``measures-time`` the machine alone."""
    from tqdm.auto import tqdm

    from aieng.workbook.book_pages import provenance, render_index, render_page

    started = time.perf_counter()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    pages = chapters(config)
    made = provenance()
    with tqdm(total=len(pages), desc="book", unit="page", file=sys.stderr) as bar:
        lessons = [p for p in pages if p.kind == "lesson"]
        runbooks = [p for p in pages if p.kind == "runbook"]
        for page in lessons:
            _run(page, out, config, None, bar, around_cell)
        if runbooks:
            with runbook_stage(store_root()) as (store, url, source):
                for page in runbooks:
                    _run(page, out, config, runbook_parameters(page.name, store, url, source), bar, around_cell)
    for index, page in enumerate(pages):
        neighbours = (pages[index - 1] if index else None, pages[index + 1] if index + 1 < len(pages) else None)
        render_page(page, out, made, neighbours)
    record = {**made, "seconds": round(time.perf_counter() - started, 1), "pages": [asdict(p) for p in pages]}
    render_index(record, out)
    (out / "book.json").write_text(json.dumps(record, indent=1))
    return record


def _run(page: Page, out: Path, config: BookConfig, parameters: dict | None, bar, around_cell) -> None:
    bar.set_postfix_str(page.name)
    execute(page, out, config, parameters, around_cell)
    bar.write(f"  {page.name}: {page.status} in {page.seconds:.1f} s" + (f" ({page.error})" if page.error else ""))
    bar.update(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aieng.workbook.book",
        description="Execute the workbook's lessons and the runbooks' dry runs and build a static site of "
        "the executed copies (index.html). Needs the demo model in the store (make demo).",
    )
    parser.add_argument("--out", type=Path, default=BookConfig.out, help="site folder (default: var/book)")
    parser.add_argument("--notebook", action="append", default=[], help="build only this lesson (repeatable)")
    parser.add_argument("--no-runbooks", action="store_true", help="leave the runbooks' pages out")
    parser.add_argument("--cell-timeout", type=int, default=BookConfig.cell_timeout_s, help="seconds per cell")
    parser.add_argument(
        "--check",
        action="store_true",
        help="then open every page in headless Chromium (aieng.workbook.book_browser) and keep screenshots",
    )
    args = parser.parse_args(argv)
    config = BookConfig(
        out=args.out,
        notebooks=tuple(args.notebook),
        runbooks=() if args.no_runbooks else None,
        cell_timeout_s=args.cell_timeout,
    )
    record = build(config)
    failed = [p["name"] for p in record["pages"] if p["status"] != "ok"]
    print(f"book: {len(record['pages'])} pages in {record['seconds']:.0f} s -> {Path(args.out) / 'index.html'}")
    if failed:
        print(f"book: these pages raised (their pages show where): {', '.join(failed)}", file=sys.stderr)
    read_right = browser_check(Path(args.out)) if args.check else True  # checked even when a page raised
    return 1 if failed or not read_right else 0


def browser_check(site: Path) -> bool:
    """The built pages in headless Chromium; screenshots kept in ``site/screenshots``. True: all fine."""
    from aieng.workbook.book_browser import check_book, chromium_path

    if chromium_path() is None:
        print("book: no Chromium here, the pages were not checked in a browser (apt-get install chromium)")
        return True
    report = check_book(site, screenshots=site / "screenshots")
    wrong = {page: problems for page, problems in report.items() if problems}
    for page, problems in wrong.items():
        print(f"book: {page}: {'; '.join(problems)}", file=sys.stderr)
    print(
        f"book: {len(report)} pages opened in Chromium, {len(wrong)} with problems; "
        f"screenshots in {site / 'screenshots'}"
    )
    return not wrong


if __name__ == "__main__":
    sys.exit(main())
