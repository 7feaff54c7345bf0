"""Keep ``environment.yml`` (conda users) pinned exactly as ``requirements.lock`` (pip users).

``make lock`` regenerates both; a test checks they agree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)")


def read_lock(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def render_environment(pins: dict[str, str], python: str = "3.11") -> str:
    lines = [
        "# Generated from requirements.lock by `make lock`; do not edit by hand.",
        "# conda env create -f environment.yml && conda activate aieng && pip install --no-deps -e .",
        "name: aieng",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        f"  - python={python}",
        "  - pip",
        "  - pip:",
    ]
    lines += [f"      - {name}=={version}" for name, version in sorted(pins.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    lock, out = Path(argv[0]), Path(argv[1])
    out.write_text(render_environment(read_lock(lock)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
