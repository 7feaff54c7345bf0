"""Model references: ``name`` or ``name@version``, and the rules for valid names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aieng.errors import StoreError

# Names become directory names: keep them to a safe, portable alphabet (no '/', no '@', no '..').
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it is a safe model name or version, else raise a StoreError saying why."""
    if not _NAME_RE.match(value or "") or ".." in value:
        raise StoreError(
            f"invalid model {what} {value!r}: use letters, digits, '.', '_' or '-', starting with a letter or digit",
            param=what,
        )
    return value


@dataclass(frozen=True)
class ModelRef:
    name: str
    version: str | None = None  # None means "whatever `current` points to"

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


def parse_ref(text: str) -> ModelRef:
    """Parse ``N`` or ``N@V`` (as the CLI and ``AIENG_MODEL`` take them)."""
    name, sep, version = text.partition("@")
    check_name(name)
    if sep:
        check_name(version, "version")
        return ModelRef(name, version)
    return ModelRef(name)
