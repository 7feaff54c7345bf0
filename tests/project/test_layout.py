"""The package's shape, as docs/architecture.md promises it: small modules, one folder per box of
the request path, no reaching into another folder's private names."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "aieng"
MODULES = sorted(PACKAGE.rglob("*.py"))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_engine_is_gpt_fast_sized():
    assert _lines(PACKAGE / "engine" / "engine.py") <= 320


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_reads_in_one_sitting(path):
    assert _lines(path) <= 400


def _private_imports_across_folders(path: Path) -> list[str]:
    folder = path.parent
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aieng"):
            target = PACKAGE.parent / Path(*node.module.split("."))
            target_folder = target if target.is_dir() else target.parent
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and target_folder != folder:
                    found.append(f"{node.module}.{alias.name}")
    return found


def test_no_module_imports_a_private_name_from_another_folder():
    offenders = {str(p.relative_to(PACKAGE)): _private_imports_across_folders(p) for p in MODULES}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_checker_sees_a_private_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from aieng.engine.engine import _combine_decoded, Engine\nfrom aieng import __version__\n")
    assert _private_imports_across_folders(probe) == ["aieng.engine.engine._combine_decoded"]


def test_serve_can_set_up_multiprocess_metrics_before_prometheus_client_is_imported():
    """prometheus_client picks its value class at import: the directory must exist first
    (aieng.observability.prom). Nothing `aieng serve` imports before that may import it."""
    code = ("import sys, aieng.cli.main, aieng.cli.serve_cmd, aieng.observability.prom, aieng.observability; "
            "print('prometheus_client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
