"""Registering a model folder as a new store version: refuse what cannot be served, copy it into a
staged directory, hash every file, write the manifest, rename into place (``staging``)."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import shutil
from pathlib import Path

from aieng.errors import StoreError
from aieng.evaluation.suite_file import SUITE_DIR, SUITE_FILE, Suite, load_suite, suite_yaml
from aieng.host.hardware import dependency_versions, hardware_profile
from aieng.store.hashing import hash_tree
from aieng.store.introspect import inspect_folder
from aieng.store.manifest import Manifest
from aieng.store.refs import check_name
from aieng.store.staging import owned_name, staged_directory
from aieng.store.stamps import utc_now


def register(
    store,
    source: Path | str,
    name: str,
    version: str,
    *,
    provenance: str | None = None,
    suite: Path | str | None = None,
) -> Manifest:
    """Copy a safetensors model folder into the store as ``name@version`` (status ``candidate``).

    The version's eval suite travels with it: ``suite`` (a suite file) or the folder's own
    ``eval-suite/suite.yaml`` (a demo build ships one) is checked, stored under ``eval-suite/``
    and hashed with the weights; the manifest's ``suite`` entry names it and its thresholds."""
    source = Path(source).resolve()
    check_name(name)
    check_name(version, "version")
    facts = inspect_folder(source)  # refuses pickle, non-causal-LM, remote code, no safetensors
    chosen = load_suite(suite) if suite is not None else None  # a bad suite refuses before any copy
    if chosen is None and (source / SUITE_FILE).is_file():
        chosen = load_suite(source / SUITE_FILE)
    check_space(store.root, source)  # before copying gigabytes, not at the last file
    target = store.version_dir(name, version)

    def exists(_target: Path) -> StoreError:  # a concurrent register of the same version may win
        return StoreError(f"{name}@{version} already exists; versions are immutable: register a new version")

    # replace_empty=False: an empty versions/<v> still lists as a version, and versions are immutable.
    with staged_directory(
        target, tmp_name=owned_name(".registering-"), lock=store._lock(name), exists_error=exists, replace_empty=False
    ) as tmp:
        shutil.copytree(
            source,
            tmp,
            symlinks=False,
            dirs_exist_ok=True,
            copy_function=functools.partial(_copy_file, store.root),
            ignore=shutil.ignore_patterns(".*", "manifest.json", "__pycache__"),
        )
        suite_entry = stage_suite(tmp, chosen) if chosen is not None else None
        manifest = Manifest(
            name=name,
            version=version,
            created_at=utc_now(),
            source=provenance or str(source),
            files=hash_tree(tmp),
            architecture=facts.architecture,
            num_parameters=facts.num_parameters,
            dtype=facts.dtype,
            context_length=facts.context_length,
            hardware_profile=hardware_profile(),
            dependencies=dependency_versions(),
            prompt_template=versioned_template(store, name, facts.prompt_template),
            suite=suite_entry,
        )
        manifest.write(tmp)
    return manifest


def stage_suite(version_dir: Path, suite: Suite) -> dict:
    """Write ``suite`` (and its perplexity text) into ``version_dir/eval-suite/``, replacing a
    suite the folder brought; returns the manifest's ``suite`` entry. The copy names its text by
    file name beside it, which leaves the suite's content hash unchanged."""
    target = version_dir / SUITE_DIR
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    document = json.loads(json.dumps(suite.document))
    if suite.perplexity_text is not None:
        shutil.copyfile(suite.perplexity_text, target / suite.perplexity_text.name)
        document["perplexity"]["text"] = suite.perplexity_text.name
    (version_dir / SUITE_FILE).write_text(suite_yaml(document))
    stored = load_suite(version_dir / SUITE_FILE)
    if stored.sha256 != suite.sha256:  # cannot happen unless the copy is broken: refuse, do not guess
        raise StoreError(f"the stored copy of suite {suite.label} does not hash like {suite.path}")
    return stored.record(SUITE_FILE)


SPARE_BYTES = 64 * 2**20  # a disk filled to the last byte fails the next log or history write
SPARE_SHARE = 0.05  # and a share of the copy's size, for what else writes there meanwhile


def check_space(store_root: Path, source: Path) -> tuple[int, int]:
    """``(bytes a copy of source needs, bytes free where the store writes)``; StoreError when the
    copy would not leave ``SPARE_SHARE`` of its size and ``SPARE_BYTES`` free. A pre-check, so a runbook refuses
    before its first write; the copy itself still stops cleanly at a full disk (``_copy_file``)."""
    source = Path(source)
    needed = sum(
        path.stat().st_size
        for path in source.rglob("*")
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(source).parts)
    )
    existing = Path(store_root).resolve()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed * (1 + SPARE_SHARE) + SPARE_BYTES:
        raise StoreError(
            f"registering {source} needs {needed / 2**30:.2f} GiB under {existing}, which has "
            f"{free / 2**30:.2f} GiB free; free space (df -h {existing}) or use a store on a larger disk "
            "(--store or AIENG_STORE)"
        )
    return needed, free


def _copy_file(root: Path, src: str, dst: str) -> str:
    """``copy2`` that stops the copy at a full disk with a clear error (``copytree`` would
    otherwise collect one OSError per remaining file and raise them all at the end)."""
    try:
        return shutil.copy2(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise StoreError(
            f"no space left on device under {root} while copying {Path(src).name}; nothing "
            f"was registered. Free space (df -h {root}) and register again"
        ) from exc


def versioned_template(store, name: str, template: dict | None) -> dict | None:
    """The template entry with its ``version``: the number of a template this model shipped
    before under the same sha256, else one more than the highest so far (1 for the first).
    So "template 2" means the model's prompt format changed once, whatever the files say."""
    if template is None:
        return None
    seen = {}
    for version in store.versions(name):
        with contextlib.suppress(OSError, ValueError):
            known = Manifest.read(store.version_dir(name, version)).prompt_template or {}
            if "sha256" in known and "version" in known:
                seen[known["sha256"]] = known["version"]
    number = seen.get(template["sha256"], max(seen.values(), default=0) + 1)
    return {**template, "version": number}
