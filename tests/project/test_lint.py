"""ruff, as `make lint` runs it: the package, the tests and the scripts lint clean and are formatted
(pyproject.toml's [tool.ruff] says which rules and why the few ignored ones are)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"}
    )


def test_the_code_lints_clean():
    result = _ruff("check", "aieng", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_code_is_formatted():
    result = _ruff("format", "--check", "aieng", "tests", "scripts")
    assert result.returncode == 0, f"run `ruff format aieng tests scripts`:\n{result.stdout}{result.stderr}"


def test_the_lint_sees_a_problem(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx=1\n")
    assert _ruff("check", "--config", str(ROOT / "pyproject.toml"), str(bad)).returncode != 0
    assert _ruff("format", "--check", "--config", str(ROOT / "pyproject.toml"), str(bad)).returncode != 0
