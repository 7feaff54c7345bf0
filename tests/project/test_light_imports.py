"""A runbook that only talks to a server (canary, rollback, load test, triage) and the store
commands import neither torch nor transformers: each execution of a runbook starts a kernel, and
torch's import alone took longer than the rest of such a runbook's start."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: deploy_model evaluates the candidate's weights in the kernel.
LOADS_WEIGHTS = {"deploy_model"}
IMPORT = re.compile(r"^\s*(?:from (aieng[\w.]*) import|import (aieng[\w.]*))", re.MULTILINE)


def aieng_imports(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return sorted({a or b for a, b in IMPORT.findall(code)})


def imports_torch(modules: list[str]) -> list[str]:
    probe = (
        f"import json, sys\nfor m in {modules!r}: __import__(m)\n"
        "print(json.dumps([m for m in ('torch', 'transformers') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    "runbook", sorted(p.stem for p in (ROOT / "runbooks").glob("*.ipynb") if p.stem not in LOADS_WEIGHTS)
)
def test_a_runbook_that_talks_to_a_server_imports_no_torch(runbook):
    modules = aieng_imports(ROOT / "runbooks" / f"{runbook}.ipynb")
    assert imports_torch(modules) == [], modules


def test_the_store_and_the_cli_import_no_torch():
    assert imports_torch(["aieng.store", "aieng.cli.main"]) == []
