"""ModelStore: register, verify, promote, roll back and remove model versions safely.

Every mutation either completes or leaves the store as it was:
- a new version is assembled in a hidden temp dir and renamed into ``versions/`` at the end
  (``staging.staged_directory``);
- ``current`` is replaced by renaming a fresh symlink over it (atomic on POSIX), so readers never
  see it missing;
- mutations of one model take an exclusive ``flock`` on ``<name>/.lock``, so concurrent
  promotes serialise and ``history.jsonl`` lines never interleave.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from aieng.errors import ModelNotFoundError, StoreError, VerificationError
from aieng.hardware import dependency_versions, hardware_profile
from aieng.store.hashing import compare_hashes, hash_tree
from aieng.store.introspect import inspect_folder
from aieng.store.manifest import Manifest
from aieng.store.refs import ModelRef, check_name
from aieng.store.staging import fsync_dir, staged_directory


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_actor() -> str:
    try:
        return os.environ.get("AIENG_ACTOR") or getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return f"uid:{os.getuid()}"


@dataclass(frozen=True)
class VerifyReport:
    name: str
    version: str
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


class ModelStore:
    def __init__(self, root: Path | str):
        self.root = Path(root)

    # -- paths ---------------------------------------------------------------------------------
    def model_dir(self, name: str) -> Path:
        return self.root / check_name(name)

    def version_dir(self, name: str, version: str) -> Path:
        return self.model_dir(name) / "versions" / check_name(version, "version")

    def history_path(self, name: str) -> Path:
        return self.model_dir(name) / "history.jsonl"

    @contextlib.contextmanager
    def _lock(self, name: str):
        directory = self.model_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- queries -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "versions").is_dir())

    def versions(self, name: str) -> list[str]:
        directory = self.model_dir(name) / "versions"
        if not directory.is_dir():
            return []
        return sorted((p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")), key=_version_key)

    def current(self, name: str) -> str | None:
        link = self.model_dir(name) / "current"
        if not link.is_symlink():
            return None
        return Path(os.readlink(link)).name

    def resolve(self, ref: ModelRef) -> str:
        """The concrete version a reference names, or a ModelNotFoundError saying what exists."""
        if ref.name not in self.names():
            known = ", ".join(self.names()) or "none"
            raise ModelNotFoundError(f"model {ref.name!r} is not in the store at {self.root} (models: {known}); "
                                     f"register one with: aieng model register SRC --name {ref.name} --version V")
        if ref.version is None:
            version = self.current(ref.name)
            if version is None:
                raise ModelNotFoundError(f"model {ref.name!r} has no current version; promote one with: "
                                         f"aieng model promote {ref.name} V")
            return version
        if ref.version not in self.versions(ref.name):
            raise ModelNotFoundError(f"{ref} does not exist; versions of {ref.name}: {', '.join(self.versions(ref.name)) or 'none'}")
        return ref.version

    def path(self, ref: ModelRef) -> Path:
        return self.version_dir(ref.name, self.resolve(ref))

    def manifest(self, ref: ModelRef) -> Manifest:
        return Manifest.read(self.path(ref))

    def history(self, name: str) -> list[dict]:
        path = self.history_path(name)
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # -- register ------------------------------------------------------------------------------
    def register(self, source: Path | str, name: str, version: str, *, provenance: str | None = None) -> Manifest:
        """Copy a safetensors model folder into the store as ``name@version`` (status ``candidate``)."""
        source = Path(source).resolve()
        check_name(name)
        check_name(version, "version")
        facts = inspect_folder(source)  # refuses pickle, non-causal-LM, remote code, no safetensors
        target = self.version_dir(name, version)

        def exists(_target: Path) -> StoreError:  # a concurrent register of the same version may win
            return StoreError(f"{name}@{version} already exists; versions are immutable: register a new version")

        # replace_empty=False: an empty versions/<v> still lists as a version, and versions are immutable.
        with staged_directory(target, tmp_name=f".tmp-{version}-{uuid.uuid4().hex[:8]}", lock=self._lock(name),
                              exists_error=exists, replace_empty=False) as tmp:
            shutil.copytree(source, tmp, symlinks=False, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".*", "manifest.json", "__pycache__"))
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
                prompt_template=self._versioned_template(name, facts.prompt_template),
            )
            manifest.write(tmp)
        return manifest

    def _versioned_template(self, name: str, template: dict | None) -> dict | None:
        """The template entry with its ``version``: the number of a template this model shipped
        before under the same sha256, else one more than the highest so far (1 for the first).
        So "template 2" means the model's prompt format changed once, whatever the files say."""
        if template is None:
            return None
        seen = {}
        for version in self.versions(name):
            with contextlib.suppress(OSError, ValueError):
                known = Manifest.read(self.version_dir(name, version)).prompt_template or {}
                if "sha256" in known and "version" in known:
                    seen[known["sha256"]] = known["version"]
        number = seen.get(template["sha256"], max(seen.values(), default=0) + 1)
        return {**template, "version": number}

    # -- verify --------------------------------------------------------------------------------
    def verify(self, ref: ModelRef) -> VerifyReport:
        version = self.resolve(ref)
        directory = self.version_dir(ref.name, version)
        try:
            manifest = Manifest.read(directory)
        except (OSError, ValueError) as exc:
            return VerifyReport(ref.name, version, [f"missing: manifest.json ({exc})"])
        return VerifyReport(ref.name, version, compare_hashes(manifest.files, directory))

    def verify_or_raise(self, ref: ModelRef) -> VerifyReport:
        report = self.verify(ref)
        if not report.ok:
            raise VerificationError(
                f"{report.name}@{report.version} failed verification: {'; '.join(report.problems)}. "
                "Do not serve it: re-register the version from its source, or roll back",
                problems=report.problems,
            )
        return report

    # -- promote / rollback --------------------------------------------------------------------
    def promote(self, name: str, version: str, *, reason: str = "promote", actor: str | None = None,
                check: Callable[[str | None], dict | None] | None = None) -> dict:
        """Point ``current`` at ``version`` (verified first) and record it in history.

        ``check`` (the release gate, ``aieng.release.promotion``) runs under the model's lock with
        the version that is current at that moment, so no other promote can slip between the
        judgement and the switch; it raises to refuse, or returns a record that is written into
        the version's manifest (``release_gate``) and the history event (``gate``)."""
        self.resolve(ModelRef(name, version))
        self.verify_or_raise(ModelRef(name, version))
        with self._lock(name):
            record = check(self.current(name)) if check is not None else None
            return self._switch(name, version, action="promote", reason=reason, actor=actor, gate=record)

    def record_event(self, name: str, event: dict) -> dict:
        """Append a non-switching event (a refused promote) to history, under the model's lock."""
        with self._lock(name):
            event = {"ts": utc_now(), **event}
            self._append_history(name, event)
            return event

    def rollback_target(self, name: str, to: str | None = None) -> str:
        """The version ``rollback`` would switch to, without switching (dry runs, runbooks)."""
        current = self.current(name)
        if to is None:
            stack = [v for v in self._promotion_stack(name) if v in self.versions(name)]
            if current is None or len(stack) < 2:
                raise StoreError(f"{name} has no previous promoted version to roll back to "
                                 f"(current: {current or 'none'}); promote a version, or name one with --to V")
            return stack[-2]
        self.resolve(ModelRef(name, to))
        if to == current:
            raise StoreError(f"{name}@{to} is already current; nothing to roll back")
        return to

    def rollback(self, name: str, to: str | None = None, *, reason: str = "rollback", actor: str | None = None) -> dict:
        """Go back to the previously promoted version (or ``to``), verified first."""
        with self._lock(name):
            target = self.rollback_target(name, to)
            self.verify_or_raise(ModelRef(name, target))
            return self._switch(name, target, action="rollback", reason=reason, actor=actor)

    def _promotion_stack(self, name: str) -> list[str]:
        """Replay history: promote pushes, rollback returns to an earlier entry (or pushes an unseen one)."""
        stack: list[str] = []
        for event in self.history(name):
            if event.get("action") not in ("promote", "rollback"):
                continue  # refusals and other records do not move `current`
            target = event["to"]
            if event.get("action") == "rollback" and target in stack:
                del stack[stack.index(target) + 1:]
            else:
                stack.append(target)
        return stack

    def _switch(self, name: str, version: str, *, action: str, reason: str, actor: str | None,
                gate: dict | None = None) -> dict:
        directory = self.model_dir(name)
        previous = self.current(name)
        tmp_link = directory / f".current-{uuid.uuid4().hex[:8]}"
        os.symlink(Path("versions") / version, tmp_link)
        os.replace(tmp_link, directory / "current")
        fsync_dir(directory)
        self._set_fields(name, version, status="stable", **({"release_gate": gate} if gate is not None else {}))
        if action == "rollback" and previous and previous != version:
            self._set_fields(name, previous, status="retired")
        event = {"ts": utc_now(), "action": action, "from": previous, "to": version, "reason": reason,
                 "actor": actor or default_actor()}
        if gate is not None:
            event["gate"] = gate
        self._append_history(name, event)
        return event

    def _append_history(self, name: str, event: dict) -> None:
        with open(self.history_path(name), "a") as handle:
            handle.write(json.dumps(event) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _set_fields(self, name: str, version: str, **changes) -> None:
        directory = self.version_dir(name, version)
        manifest = Manifest.read(directory)
        for key, value in changes.items():
            setattr(manifest, key, value)
        manifest.write(directory)

    # -- manifest updates ----------------------------------------------------------------------
    def update_manifest(self, ref: ModelRef, **changes) -> Manifest:
        """Set mutable fields (``eval``, ``performance_baseline``, ``status``); hashes are never touched."""
        allowed = {"eval", "performance_baseline", "status"}
        if set(changes) - allowed:
            raise StoreError(f"only {sorted(allowed)} can change after registration")
        with self._lock(ref.name):
            directory = self.path(ref)
            manifest = Manifest.read(directory)
            for key, value in changes.items():
                setattr(manifest, key, value)
            manifest.write(directory)
            return manifest

    # -- remove --------------------------------------------------------------------------------
    def remove(self, name: str, version: str) -> None:
        with self._lock(name):
            self.resolve(ModelRef(name, version))
            if self.current(name) == version:
                raise StoreError(f"{name}@{version} is current and cannot be removed; promote or roll back first")
            target = self.version_dir(name, version)
            # Rename first so a crash mid-delete never leaves a half version that looks real.
            doomed = target.parent / f".removing-{version}-{uuid.uuid4().hex[:8]}"
            os.rename(target, doomed)
            shutil.rmtree(doomed)


def _version_key(version: str):
    """Sort '2' before '10' but still order arbitrary strings."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in version.replace("-", ".").split(".")]
