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
    # gpt-fast's generate.py is the yardstick: the loop alone, read in one sitting (as ruff formats it)
    assert _lines(PACKAGE / "engine" / "engine.py") <= 350


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
    code = (
        "import sys, aieng.cli.main, aieng.cli.serve_cmd, aieng.observability.prom, aieng.observability; "
        "print('prometheus_client' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a function (a deferred
    import hides a cycle from Python, not from a reader)."""
    modules = {}
    for path in MODULES:
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        modules[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = owner(target) if target.startswith("aieng") else None
                if found and found != name and not name.startswith(found + "."):  # its own package's face
                    graph[name].add(found)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_the_package():
    assert _cycles(_import_graph()) == []


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _runner_probes(path: Path) -> list[str]:
    """Places outside the engine that reach into a runner: hasattr/getattr on one, or `.runner.`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
            if node.args and "runner" in ast.unparse(node.args[0]):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "runner":
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_nothing_outside_the_engine_reaches_into_a_runner():
    outside = [p for p in MODULES if (PACKAGE / "engine") not in p.parents]
    assert [probe for p in outside for probe in _runner_probes(p)] == []
    inside = [
        probe
        for p in (PACKAGE / "engine").rglob("*.py")
        for probe in _runner_probes(p)
        if "hasattr" in probe or "getattr" in probe
    ]
    assert inside == [], "the engine asks a runner through the Runner protocol, never by probing"


def test_the_runner_probe_check_sees_a_probe(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("x = hasattr(engine.runner, 'build_graphs')\ny = engine.runner.cache\nz = plan.runner\n")
    assert len(_runner_probes(probe)) == 2
