"""Each lesson names, at its top, the package modules it teaches; they exist, and the lesson
imports each (or a module of its package folder: it runs the code, never a copy) or explains it
by name in its prose."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def taught(path: Path) -> list[str]:
    first = "".join(cells(path)[0]["source"])
    line = next((line for line in first.splitlines() if line.startswith("**Teaches**: ")), "")
    return re.findall(r"`(aieng(?:\.\w+)+)`", line)


def imported(path: Path) -> set[str]:
    code = "\n".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "code")
    return {a or b for a, b in re.findall(r"^\s*from (aieng[\w.]*) import|^\s*import (aieng[\w.]*)", code, re.M)}


def prose_after_the_line(path: Path) -> str:
    text = "\n".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "markdown")
    return "\n".join(line for line in text.splitlines() if not line.startswith("**Teaches**: "))


def test_every_lesson_is_checked():
    assert len(NOTEBOOKS) == 9


def problems(notebook: Path) -> list[str]:
    modules = taught(notebook)
    if not modules:
        return [f"{notebook.name}: its first cell needs a line '**Teaches**: `aieng.x.y`, ...'"]
    found = [m for m in modules if (ROOT / (m.replace(".", "/") + ".py")).is_file()]
    folders = {m.rsplit(".", 1)[0] for m in imported(notebook)} | imported(notebook)
    prose = prose_after_the_line(notebook)
    return [f"{notebook.name} names {m}, which does not exist" for m in modules if m not in found] + [
        f"{notebook.name} teaches {m}: neither imported (nor its package) nor explained"
        for m in found
        if m.rsplit(".", 1)[0] not in folders and m not in prose and m.replace(".", "/") not in prose
    ]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lesson_names_the_modules_it_teaches_and_they_exist(notebook):
    assert problems(notebook) == []


def test_the_check_finds_a_module_that_is_not_there_one_not_taught_and_a_missing_line(tmp_path):
    def lesson(first: str, code: str = "") -> Path:
        path = tmp_path / "00_x.ipynb"
        cells = [{"cell_type": "markdown", "source": [first]}, {"cell_type": "code", "source": [code]}]
        path.write_text(json.dumps({"cells": cells}))
        return path

    assert problems(lesson("# x\n**Teaches**: `aieng.nope.gone`.\n")) == [
        "00_x.ipynb names aieng.nope.gone, which does not exist"
    ]
    assert "neither imported" in problems(lesson("# x\n**Teaches**: `aieng.release.watch`.\n"))[0]
    assert (
        problems(lesson("# x\n**Teaches**: `aieng.release.watch`.\n", "from aieng.release.decision import decide"))
        == []
    )
    assert "needs a line" in problems(lesson("# x\n"))[0]
