"""File hashing: the store's integrity check is sha256 of every file of a version."""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST_NAME = "manifest.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(root: Path) -> list[str]:
    """Every regular file under ``root`` as a POSIX relative path, except the manifest itself.

    The manifest is excluded because it records the hashes (and mutable fields such as
    ``status`` and ``eval``); everything the loader reads is covered.
    """
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            rel = path.relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                out.append(rel)
    return out


def hash_tree(root: Path) -> dict[str, str]:
    return {rel: sha256_file(root / rel) for rel in list_files(root)}


def compare_hashes(expected: dict[str, str], root: Path) -> list[str]:
    """Problems as readable lines ('mismatched: X', 'missing: X', 'extra: X'); empty when intact."""
    problems = []
    present = set(list_files(root))
    # Symlinks inside a version are never expected: a link could point anywhere on disk.
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            problems.append(f"extra: {path.relative_to(root).as_posix()} (symlink)")
    for rel, want in sorted(expected.items()):
        if rel not in present:
            problems.append(f"missing: {rel}")
        elif sha256_file(root / rel) != want:
            problems.append(f"mismatched: {rel} (sha256 differs from manifest)")
    for rel in sorted(present - set(expected)):
        problems.append(f"extra: {rel}")
    return problems


def fingerprint(files: dict[str, str]) -> str:
    """One sha256 for a whole version: the hash of its sorted (path, sha256) list."""
    digest = hashlib.sha256()
    for rel, sha in sorted(files.items()):
        digest.update(f"{rel}\0{sha}\n".encode())
    return digest.hexdigest()
