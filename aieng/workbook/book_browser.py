"""The built book and JupyterLab as a learner meets them: in a real browser (headless Chromium,
driven by Playwright).

What a reader would notice is what is checked: a page that shows an error or a traceback, a
picture that does not load, a drawing cell with no picture, a contents link that leads nowhere,
and, in JupyterLab (``make lab``), a lesson that does not open on the "Python 3 (aieng)" kernel or
whose first cells do not run. Playwright drives the machine's own Chromium (``$AIENG_CHROMIUM``, or
``chromium`` on the PATH: Debian's ``apt-get install chromium``); nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from aieng.workbook.book_pages import PLOT_TAG
from aieng.workbook.paths import PROJECT_ROOT

#: Chromium as root in a container, on a machine with no route out: no sandbox, no GPU, and no
#: background fetches (each would be refused and retried).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Text a page must not show: an exception's trace, or papermill's banner over the cell that raised.
ERROR_TEXTS = ("Traceback (most recent call last)", "ModuleNotFoundError", "An Exception was encountered")
KERNEL_LABEL = "Python 3 (aieng)"

PAGE_FACTS = """() => {
  const images = [...document.images];
  return {
    text: document.body.innerText,
    images: images.length,
    broken: images.filter(i => !i.complete || i.naturalWidth === 0).length,
    plot_cells: [...document.querySelectorAll('.celltag_PLOT_TAG')].map(
      c => [...c.querySelectorAll('img')].filter(i => i.naturalWidth > 0).length),
    links: [...document.querySelectorAll('a[href$=".html"]')].map(a => a.href),
  };
}""".replace("PLOT_TAG", PLOT_TAG)


def chromium_path() -> str | None:
    """The Chromium to drive, or None when this machine has none."""
    configured = os.environ.get("AIENG_CHROMIUM")
    if configured:
        return configured
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@contextlib.contextmanager
def browser():
    """A headless Chromium (Playwright's ``Browser``), closed on the way out."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        raise RuntimeError("no Chromium found: apt-get install chromium, or set AIENG_CHROMIUM to its path")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@contextlib.contextmanager
def served(site: Path):
    """The site folder over HTTP on a free loopback port, as a reader's browser would fetch it."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would drown the test output
        pass


def page_problems(facts: dict) -> list[str]:
    """What a reader would see wrong on one page, from the facts ``PAGE_FACTS`` read off it."""
    problems = [f"shows {text!r}" for text in ERROR_TEXTS if text in facts["text"]]
    if facts["broken"]:
        problems.append(f"{facts['broken']} of {facts['images']} images did not load")
    empty = [n for n, shown in enumerate(facts["plot_cells"], 1) if shown == 0]
    if empty:
        problems.append(f"drawing cells {empty} (of {len(facts['plot_cells'])}) show no picture")
    return problems


def check_book(site: Path, screenshots: Path | None = None, plot_page: str = "05_batching") -> dict[str, list[str]]:
    """Open the index and every page it links to; return each page's problems (empty: fine).
    With ``screenshots``, keep the index and the first plot of ``plot_page`` as PNGs there."""
    site = Path(site)
    report: dict[str, list[str]] = {}
    with served(site) as base, browser() as chromium:
        tab = chromium.new_page(viewport={"width": 1280, "height": 900})
        tab.goto(f"{base}/index.html", wait_until="load")
        index = tab.evaluate(PAGE_FACTS)
        report["index"] = page_problems(index)
        if screenshots is not None:
            screenshots.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(screenshots / "index.png"), full_page=True)
        for link in dict.fromkeys(index["links"]):
            name = link.rsplit("/", 1)[-1].removesuffix(".html")
            response = tab.goto(link, wait_until="load")
            if response is None or response.status != 200:
                report[name] = [f"the contents link {link} answers {response and response.status}"]
                continue
            report[name] = page_problems(tab.evaluate(PAGE_FACTS))
            if screenshots is not None and name == plot_page:
                first_plot = tab.locator(f".celltag_{PLOT_TAG} img").first
                if first_plot.count():
                    first_plot.scroll_into_view_if_needed()
                    first_plot.screenshot(path=str(screenshots / f"{plot_page}-plot.png"))
                tab.screenshot(path=str(screenshots / f"{plot_page}.png"))
    return report


@contextlib.contextmanager
def jupyterlab(root: Path = PROJECT_ROOT / "notebooks", timeout_s: float = 120):
    """``make lab``'s JupyterLab on a free loopback port with a one-off token; its settings and
    workspaces in a temporary folder, so a check leaves nothing in the user's home."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="aieng-lab-") as home:
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": f"{home}/runtime", "JUPYTER_CONFIG_DIR": f"{home}/config"}
        command = [
            sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
            f"--LabApp.user_settings_dir={home}/settings", f"--LabApp.workspaces_dir={home}/workspaces",
        ]  # fmt: skip
        log = open(Path(home) / "lab.log", "w+")  # noqa: SIM115 - read back on a failed start
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_lab(port, token, process, log, timeout_s)
            yield f"http://127.0.0.1:{port}", token
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


def _wait_for_lab(port: int, token: str, process, log, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/api/status", params={"token": token}, timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    log.seek(0)
    raise RuntimeError(f"JupyterLab did not start in {timeout_s:.0f} s:\n{log.read()[-3000:]}")


def check_lab(notebook: str = "01_process_setup.ipynb", cells: int = 3, timeout_s: float = 180) -> list[str]:
    """Open ``notebook`` in JupyterLab, check its kernel is "Python 3 (aieng)", run its first
    ``cells`` cells (Shift+Enter, as a learner does) and return what went wrong (empty: fine)."""
    with jupyterlab() as (base, token), browser() as chromium:
        tab = chromium.new_page(viewport={"width": 1280, "height": 900})
        tab.goto(f"{base}/lab/tree/{notebook}?token={token}", wait_until="domcontentloaded")
        timeout_ms = timeout_s * 1000
        tab.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=timeout_ms)
        kernel = tab.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")
        kernel.filter(has_text=KERNEL_LABEL).wait_for(timeout=timeout_ms)
        tab.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=timeout_ms)
        tab.locator(".jp-Notebook .jp-Cell").first.click()
        for _ in range(cells):
            tab.keyboard.press("Shift+Enter")
        kinds = tab.locator(".jp-Notebook .jp-Cell").evaluate_all(
            "cells => cells.map(c => c.classList.contains('jp-CodeCell'))"
        )
        ran = sum(kinds[:cells])
        code_cells = tab.locator(".jp-Notebook .jp-CodeCell")
        problems = []
        for i in range(ran):
            prompt = code_cells.nth(i).locator(".jp-InputPrompt")
            try:
                tab.wait_for_function(
                    "el => /\\[\\d+\\]/.test(el.innerText)", arg=prompt.element_handle(), timeout=timeout_ms
                )
            except Exception:  # Playwright's timeout: say which cell never finished
                problems.append(f"code cell {i + 1} did not finish in {timeout_s:.0f} s ({prompt.inner_text()!r})")
        text = tab.locator(".jp-Notebook").inner_text()
        problems += [f"shows {t!r}" for t in ERROR_TEXTS if t in text]
        if not ran:
            problems.append(f"none of the first {cells} cells is a code cell: nothing ran")
        if kernel.inner_text().strip() != KERNEL_LABEL:
            problems.append(f"the kernel is {kernel.inner_text()!r}, not {KERNEL_LABEL!r}")
        return problems
