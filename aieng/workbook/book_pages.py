"""The book's pages: an executed notebook rendered to HTML with where it ran, and the index.

Each page opens with a line of navigation and the record of its run (date, commit, host, CPU,
torch), because its numbers are that machine's, not a promise. A runbook's page adds what an
operator reads first: its parameters (default, this dry run's value, what each means) and its
steps with what each checks, taken from the runbook's own headings, then the executed dry run.
"""

from __future__ import annotations

import ast
import html
import re
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from aieng.workbook.paths import PROJECT_ROOT

CHECKS = "**Checks**: "
#: Cell tags the book gives: a cell that draws a picture, and the server check appended to a lesson.
PLOT_TAG = "book-plot"
CHECK_TAG = "book-check"
RUN_NOTE = "Executed {date} on `{host}` ({cpu}, {cores} cores, torch {torch}) at commit `{commit}`{took}."


def provenance() -> dict:
    """When, where and from which commit the book is built."""
    from aieng.host.hardware import dependency_versions, hardware_profile

    profile = hardware_profile()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git("rev-parse", "--short", "HEAD")
        + (" (with local changes)" if _git("status", "--porcelain") else ""),
        "host": socket.gethostname(),
        "cpu": profile["cpu_model"],
        "cores": profile["cpu_cores"],
        "torch": profile["torch"],
        "versions": dependency_versions(),
    }


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def title_of(nb) -> str:
    """The notebook's first heading, without its marks."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return "untitled"


def parameter_rows(nb) -> list[tuple[str, str, str]]:
    """``(name, default, comment)`` of each assignment in the cell tagged ``parameters``."""
    cell = next((c for c in nb.cells if "parameters" in c.metadata.get("tags", [])), None)
    if cell is None:
        return []
    rows = []
    for line in cell.source.splitlines():
        match = re.match(r"^(\w+)\s*=\s*(.*?)\s*(?:#\s*(.*))?$", line)
        if match and _is_literal(match.group(2)):
            rows.append((match.group(1), match.group(2), match.group(3) or ""))
    return rows


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False
    return True


def steps(nb) -> list[tuple[str, str]]:
    """``(heading, what it checks)`` of each ``##`` section of a runbook: the ``**Checks**:`` line
    each step opens with ("" where it has none; tests/runbooks/test_runbook_shape.py keeps them)."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("## "):
                section = []
                for rest in lines[i + 1 :]:
                    if rest.startswith("#"):
                        break
                    section.append(rest.strip())
                paragraphs = [p.strip() for p in "\n".join(section).split("\n\n")]
                checks = next((p for p in paragraphs if p.startswith(CHECKS)), "")
                found.append((line[3:].strip(), " ".join(checks.removeprefix(CHECKS).split())))
    return found


def runbook_summary(nb, parameters: dict) -> str:
    """The markdown of a runbook page's "at a glance": parameters, then steps."""
    out = ["## At a glance", "", "| parameter | default | this dry run | what it is |", "| --- | --- | --- | --- |"]
    for name, default, comment in parameter_rows(nb):
        given = f"`{parameters[name]!r}`" if name in parameters else ""
        what = html.escape(comment).replace("|", "/")  # a comment's <project> is text, not a tag
        out.append(f"| `{name}` | `{default}` | {given} | {what} |")
    out += ["", "**Steps, and what each checks:**", ""]
    out += [f"{n}. **{heading}**: {text or '(see the step below)'}" for n, (heading, text) in enumerate(steps(nb), 1)]
    out += [
        "",
        "Below: the runbook executed as a dry run on a temporary store (demo@1 and @2 promoted, @3 a "
        "candidate) and a one-worker server, so it shows every pre-check and what it would do, and changes nothing.",
    ]
    return "\n".join(out)


def render_page(page, out: Path, made: dict, neighbours: tuple) -> None:
    """Write ``out/<name>.html`` from the page's executed copy, with navigation and its run record."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(page.executed, as_version=4) if Path(page.executed).is_file() else None
    if nb is None:  # it never ran far enough to be written: show the source, and say so
        nb = nbformat.read(page.source, as_version=4)
    page.title = title_of(nb)
    before, after = neighbours
    links = ["[contents](index.html)"]
    if before is not None:
        links.insert(0, f"[← {before.name}]({before.name}.html)")
    if after is not None:
        links.append(f"[{after.name} →]({after.name}.html)")
    took = f", in {page.seconds:.0f} s" if page.seconds else ""
    note = RUN_NOTE.format(took=took, **made)
    if page.status != "ok":
        note += f"\n\n**This page's notebook raised**: {page.error}. The cell that raised shows its error below."
    head = nbformat.v4.new_markdown_cell(" · ".join(links) + "\n\n" + note)
    head.metadata["tags"] = ["book-provenance"]
    nb.cells.insert(0, head)
    if page.kind == "runbook":
        title_at = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and i > 0), 1)
        nb.cells.insert(title_at + 1, nbformat.v4.new_markdown_cell(runbook_summary(nb, page.parameters)))
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb, resources={"metadata": {"name": page.title}})
    target = out / f"{page.name}.html"
    target.write_text(body, encoding="utf-8")
    page.html = target.name


INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>aieng workbook</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #ddd; }}
.failed {{ color: #b00; font-weight: bold; }} .small {{ color: #666; font-size: .9rem; }}
</style></head><body>
<h1>aieng workbook</h1>
<p>How to run an LLM text-generation service the way production demands, taught with the code that
serves it. Every page below was executed on one machine; its numbers and plots are that machine's.</p>
<p class="small">Built {date} on <code>{host}</code> ({cpu}, {cores} cores, torch {torch}) at commit
<code>{commit}</code> in {seconds:.0f} s.</p>
<h2>Lessons</h2>
{lessons}
<h2>Runbooks</h2>
<p>Operations procedures, executed with papermill. Each page shows a dry run.</p>
{runbooks}
</body></html>
"""


def _table(pages: list[dict]) -> str:
    if not pages:
        return "<p class='small'>(not built this time)</p>"
    rows = []
    for page in pages:
        status = "" if page["status"] == "ok" else f" <span class='failed'>raised: {html.escape(page['error'])}</span>"
        rows.append(
            f"<tr><td><a href='{html.escape(page['html'])}'>{html.escape(page['title'])}</a>{status}</td>"
            f"<td class='small'>{page['plots']} plot{'s' if page['plots'] != 1 else ''}</td>"
            f"<td class='small'>{page['seconds']:.0f} s</td></tr>"
        )
    return "<table><tr><th>page</th><th>plots</th><th>ran</th></tr>" + "".join(rows) + "</table>"


def render_index(record: dict, out: Path) -> None:
    """``out/index.html``: the table of contents in reading order, with each page's run."""
    fields = {k: html.escape(str(record[k])) for k in ("date", "host", "cpu", "cores", "torch", "commit")}
    lessons = [p for p in record["pages"] if p["kind"] == "lesson"]
    runbooks = [p for p in record["pages"] if p["kind"] == "runbook"]
    text = INDEX.format(seconds=record["seconds"], lessons=_table(lessons), runbooks=_table(runbooks), **fields)
    (out / "index.html").write_text(text, encoding="utf-8")
