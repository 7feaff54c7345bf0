"""The README and docs/ describe the code as it is (the parts that can drift), and link only what exists."""

import re
from pathlib import Path

from aieng.settings import settings_markdown_table

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
REFERENCE = (ROOT / "docs" / "reference.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
README = ROOT / "README.md"


def _block(name: str, text: str = REFERENCE, where: str = "docs/reference.md") -> str:
    match = re.search(rf"<!-- {name}[^>]*-->\n(.*?)\n<!-- /{name} -->", text, re.S)
    assert match, f"{where} has no {name} block"
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
    assert set(re.findall(r"`(aieng_[a-z0-9_]+)`", _block("metric-names"))) == defined


def test_every_file_the_docs_name_exists():
    text = "\n".join(doc.read_text() for doc in [README, *DOCS])
    # Files of the package, named from inside it (engine/native/slots.py) or from the root (aieng/...).
    folders = (
        "server/(?:http|process)|scheduler|engine|observability|store|bench|evaluation|release|loadtest|"
        "loading|demo|host|locks|workbook|cli"
    )
    named = set(re.findall(rf"(?<![\w/.])(?:aieng/)?((?:{folders})(?:/[a-z_]+)*/[a-z_]+\.py)\b", text))
    assert named, "the pattern found nothing: the check would pass vacuously"
    missing = sorted(p for p in named if not (ROOT / "aieng" / p).is_file())
    assert missing == []
    # Files of the repository named from its root: tests, scripts, deploy, locks, notebooks, runbooks.
    top = "tests|scripts|deploy|locks|security|notebooks|runbooks"
    rooted = set(re.findall(rf"(?<![\w/.])((?:{top})/[\w./-]*\.\w+)\b", text))
    assert rooted, "the pattern found nothing: the check would pass vacuously"
    assert sorted(p for p in rooted if not (ROOT / p).exists()) == []


def test_every_package_folder_is_in_the_folder_table():
    folders = {
        p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "aieng").rglob("*.py") if p.name != "__init__.py"
    } - {"aieng"}  # aieng/server holds only its two halves
    documented = set(re.findall(r"\| `(aieng/[a-z_/]+)/` \|", ARCHITECTURE))
    assert folders == documented


def test_the_readme_links_nothing_outside_the_repository_and_every_doc():
    targets = re.findall(r"\]\(([^)]+)\)", README.read_text())
    for target in targets:
        if target.startswith(("http://", "https://", "#")):
            continue
        assert not target.startswith(("..", "/")) and (ROOT / target.split("#")[0]).exists(), target
    assert {doc.relative_to(ROOT).as_posix() for doc in DOCS} <= {t.split("#")[0] for t in targets}


def test_the_readme_is_one_screen():
    assert len(README.read_text().splitlines()) <= 120, "the rest belongs in docs/"


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", _prose(path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_every_relative_link_resolves_to_a_file_and_its_anchor():
    checked = 0
    for doc in [README, *DOCS, *sorted((ROOT / "deploy").rglob("README.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc.read_text())):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            assert path.exists(), f"{doc.relative_to(ROOT)}: {target} names no file"
            assert path.is_relative_to(ROOT), f"{doc.relative_to(ROOT)}: {target} leaves the repository"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{doc.relative_to(ROOT)}: {target}: no such heading"
            checked += 1
    assert checked, "no link found: the check would pass vacuously"
