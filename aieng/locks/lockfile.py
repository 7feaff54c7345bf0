"""Read and rewrite pip-compile's hashed lock files, one requirement block at a time.

A block is what pip-compile writes for one package: the pin (``name==version``, optionally
``; marker``), its ``--hash`` lines and its ``# via`` comments. The lock tools move whole blocks
between files (torch out of the main locks), so nothing a block says is lost on the way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass
class Block:
    """One locked package: its pin, the environment marker it applies under, its allowed hashes."""

    name: str
    version: str
    marker: str | None = None
    hashes: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)

    def render(self) -> str:
        marker = f" ; {self.marker}" if self.marker else ""
        lines = [f"{self.name}=={self.version}{marker}" + (" \\" if self.hashes else "")]
        lines += [
            f"    --hash=sha256:{h}" + (" \\" if i < len(self.hashes) - 1 else "") for i, h in enumerate(self.hashes)
        ]
        return "\n".join(lines + self.comments)


def normalize(name: str) -> str:
    """PEP 503's name: ``Jinja2`` and ``typing_extensions`` as the registry spells them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> tuple[list[str], list[Block]]:
    """(the header lines before the first pin, the blocks in order)."""
    header: list[str] = []
    blocks: list[Block] = []
    for line in text.splitlines():
        match = _PIN.match(line.strip()) if not line.startswith((" ", "#")) else None
        if match:
            blocks.append(Block(normalize(match.group(1)), match.group(2), match.group(3)))
        elif not blocks:
            header.append(line)
        elif (found := _HASH.search(line)) is not None:
            blocks[-1].hashes.append(found.group(1))
        elif line.strip():
            blocks[-1].comments.append(line)
    return header, blocks


def render_lock(header: list[str], blocks: list[Block]) -> str:
    return "\n".join(header + [b.render() for b in blocks]) + "\n"


def read_blocks(path: Path) -> dict[str, Block]:
    return {b.name: b for b in parse_lock(Path(path).read_text())[1]}


def read_lock(path: Path) -> dict[str, str]:
    """``{name: version}`` of every pin in ``path``."""
    return {name: block.version for name, block in read_blocks(path).items()}
