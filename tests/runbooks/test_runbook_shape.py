"""Every runbook has the shape operators rely on, checked without running it: a ``parameters``
cell papermill can read in full (a line it cannot parse, one with a second ``=`` in its comment
or value, is missing from ``papermill --help-notebook`` and makes every run warn "Passed unknown
parameter", which teaches an operator to ignore warnings), and, when it changes anything,
``dry_run`` defaulting to True; and every step (a ``##`` section) opens with what it checks, which
the runbook's page in the book lists (``aieng.workbook.book_pages.steps``)."""

import ast
from pathlib import Path

import nbformat
import papermill
import pytest

RUNBOOKS = sorted((Path(__file__).resolve().parents[2] / "runbooks").glob("*.ipynb"))
READ_ONLY = {"incident_triage"}  # reads a server, writes nothing: no dry run to default to


def parameters_cell(path: Path) -> str:
    cells = [c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path.name}: one cell tagged `parameters`"
    return cells[0].source


@pytest.mark.parametrize("path", RUNBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter(path, caplog):
    assigned = {
        target.id
        for node in ast.parse(parameters_cell(path)).body
        if isinstance(node, ast.Assign)
        for target in node.targets
    }
    read = set(papermill.inspect_notebook(str(path)))
    assert read == assigned, f"papermill cannot read {sorted(assigned - read)} (an '=' or quote in the comment?)"
    assert "Unable to parse" not in caplog.text


@pytest.mark.parametrize("path", [p for p in RUNBOOKS if p.stem not in READ_ONLY], ids=lambda p: p.stem)
def test_a_runbook_that_changes_things_defaults_to_a_dry_run(path):
    defaults = papermill.inspect_notebook(str(path))
    assert defaults["dry_run"]["default"] == "True"


def test_the_check_sees_a_parameter_papermill_skips(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    cell = nbformat.v4.new_code_cell('a = 1  # fine\nb = ""  # "" = none\n')
    cell.metadata["tags"] = ["parameters"]
    nb.cells.append(cell)
    nbformat.write(nb, tmp_path / "probe.ipynb")
    assert set(papermill.inspect_notebook(str(tmp_path / "probe.ipynb"))) == {"a"}


@pytest.mark.parametrize("path", RUNBOOKS, ids=lambda p: p.stem)
def test_every_step_says_what_it_checks(path):
    from aieng.workbook.book_pages import steps

    found = steps(nbformat.read(path, as_version=4))
    assert len(found) >= 3, f"{path.name}: its steps are its ## sections"
    unsaid = [heading for heading, checks in found if not checks]
    assert not unsaid, f"{path.name}: steps without a '**Checks**: ...' line under their heading: {unsaid}"
