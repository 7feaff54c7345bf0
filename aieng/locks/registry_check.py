"""Does the registry still serve, for this platform, the very files the locks pin? ``make check-locks``.

A lock is only as good as the machine it is installed on. The locks were once written with the
CPU wheel this project's build machines keep in a local folder, and on a machine with only the
registry pip refused them ("THESE PACKAGES DO NOT MATCH THE HASHES"): the registry's file for the
same version was another build. This check asks the registry, as a user's machine would, with no
local folder and no pip configuration in the way.

For every pin whose marker holds here, it reads the registry's index page for the project (the
JSON form, PEP 691) and takes the file pip would install on this interpreter: among the release's
files that are not yanked and whose ``requires-python`` admits this Python, the wheel whose tags
come first in this interpreter's supported-tag order (``packaging.tags.sys_tags``, pip's own
order), or the sdist when no wheel fits. That file's sha256 must be one of the pin's hashes.

Why not ``pip install --dry-run --report``: without PEP 658 metadata on the index (this registry
serves none) pip downloads every wheel in full to read its requirements, several GB for the
CUDA build of torch, to learn what the index page already says.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
from packaging.markers import Marker
from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from aieng.locks.lockfile import Block, parse_lock

REGISTRY = "https://pypi.org/simple"
_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class Problem:
    lock: str
    package: str
    version: str
    detail: str

    def __str__(self) -> str:
        return f"{self.lock}: {self.package}=={self.version}: {self.detail}"


def _python_version() -> Version:
    return Version(".".join(map(str, sys.version_info[:3])))


def chosen_file(files: list[dict], version: str) -> dict | None:
    """The file pip would install here for ``version`` among an index page's ``files``."""
    tag_rank = {tag: rank for rank, tag in enumerate(sys_tags())}
    python = _python_version()
    wheels, sdists = [], []
    for entry in files:
        if entry.get("yanked") or not _admits(entry.get("requires-python"), python):
            continue
        name = entry["filename"]
        try:
            if name.endswith(".whl"):
                _, file_version, _, tags = parse_wheel_filename(name)
                ranks = [tag_rank[t] for t in tags if t in tag_rank]
                if file_version == Version(version) and ranks:
                    wheels.append((min(ranks), entry))
            else:
                _, file_version = parse_sdist_filename(name)
                if file_version == Version(version):
                    sdists.append(entry)
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
    if wheels:
        return min(wheels, key=lambda pair: pair[0])[1]
    return sdists[0] if sdists else None


def _admits(requires_python: str | None, python: Version) -> bool:
    try:
        return not requires_python or python in SpecifierSet(requires_python)
    except ValueError:  # an unparsable constraint: pip ignores it too
        return True


def check_block(block: Block, page: dict, lock: str) -> Problem | None:
    chosen = chosen_file(page.get("files", []), block.version)
    if chosen is None:
        return Problem(lock, block.name, block.version, "the registry serves no file of this version for this platform")
    digest = chosen.get("hashes", {}).get("sha256")
    if digest not in block.hashes:
        return Problem(
            lock,
            block.name,
            block.version,
            f"the registry serves {chosen['filename']} (sha256 {digest}), which the lock does not "
            "list: pip --require-hashes would refuse it; run `make lock`",
        )
    return None


def check_locks(locks: list[Path], registry: str = REGISTRY) -> tuple[int, list[Problem]]:
    """(pins checked, problems) for every pin of ``locks`` whose marker holds on this platform."""
    todo = []
    for lock in locks:
        for block in parse_lock(lock.read_text())[1]:
            if block.marker is None or Marker(block.marker).evaluate():
                todo.append((lock.name, block))
    with httpx.Client(timeout=60, headers={"Accept": _JSON}, follow_redirects=True) as client:

        def check(item):
            lock, block = item
            problem = None
            # a problem is asked again past any cache: a CDN edge has answered with a stale page
            for headers in ({}, {"Cache-Control": "no-cache"}):
                resp = client.get(f"{registry.rstrip('/')}/{block.name}/", headers=headers)
                if resp.status_code == 404:
                    return Problem(lock, block.name, block.version, "the registry has no such project")
                resp.raise_for_status()
                if (problem := check_block(block, resp.json(), lock)) is None:
                    return None
            return problem

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            problems = [p for p in pool.map(check, todo) if p is not None]
    return len(todo), problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aieng.locks.registry_check", description=__doc__.splitlines()[0])
    parser.add_argument("lock", nargs="+", type=Path, help="lock files (locks/*.lock, not torch-cpu.lock)")
    parser.add_argument("--registry", default=REGISTRY, help="the registry's simple index (PEP 691 JSON)")
    args = parser.parse_args(argv)
    checked, problems = check_locks(args.lock, args.registry)
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"checked {checked} pins against {args.registry} for this platform: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
