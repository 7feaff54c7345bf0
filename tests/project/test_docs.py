"""docs/architecture.md and the README describe the code as it is (the parts that can drift)."""

import re
from pathlib import Path

from aieng.settings import settings_markdown_table

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def _block(name: str) -> str:
    match = re.search(rf"<!-- {name}[^>]*-->\n(.*?)\n<!-- /{name} -->", ARCHITECTURE, re.S)
    assert match, f"docs/architecture.md has no {name} block"
    return match.group(1)


def test_the_settings_table_is_the_generated_one():
    assert _block("settings-table") == settings_markdown_table(), "regenerate it: python -m aieng.settings"


def test_every_metric_and_only_those_are_documented():
    from prometheus_client import Counter, Gauge, Histogram

    from aieng.observability import metrics

    defined = set()
    for value in vars(metrics).values():
        if isinstance(value, (Counter, Gauge, Histogram)):
            name = value._name
            defined.add(name + "_total" if isinstance(value, Counter) else name)
    assert set(re.findall(r"`(aieng_[a-z_]+)`", _block("metric-names"))) == defined


def test_every_file_the_architecture_names_exists():
    named = set(re.findall(r"\b(?<!tests/)((?:server/(?:http|process)|scheduler|engine|observability|store|bench|evaluation)"
                           r"/[a-z_]+\.py)\b", ARCHITECTURE))
    assert named, "the pattern found nothing: the check would pass vacuously"
    missing = sorted(p for p in named if not (ROOT / "aieng" / p).is_file())
    assert missing == []


def test_every_package_folder_is_in_the_folder_table():
    folders = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "aieng").rglob("*.py")
               if p.name != "__init__.py"} - {"aieng"}  # aieng/server holds only its two halves
    documented = set(re.findall(r"\| `(aieng/[a-z_/]+)/` \|", ARCHITECTURE))
    assert folders == documented


def test_the_readme_links_nothing_outside_the_repository():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)]+)\)", readme)
    assert "docs/architecture.md" in targets
    for target in targets:
        if target.startswith(("http://", "https://", "#")):
            continue
        assert not target.startswith(("..", "/")) and (ROOT / target.split("#")[0]).exists(), target
