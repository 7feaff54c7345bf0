"""ModelStore: register, verify, promote, roll back and remove model versions safely.

Every mutation either completes or leaves the store as it was:
- a new version is assembled in a hidden temp dir and renamed into ``versions/`` at the end
  (``staging.staged_directory``);
- ``current`` is replaced by renaming a fresh symlink over it (atomic on POSIX), so readers never
  see it missing;
- mutations of one model take an exclusive ``flock`` on ``<name>/.lock``, so concurrent
  promotes serialise and ``history.jsonl`` lines never interleave;
- a switch of ``current`` touches three things (the link, the manifests' ``status``, the history
  line), so it first writes its intent (``<name>/.switch.json``); a process killed anywhere
  after that is completed or undone by the next mutation of the model (``_recover``), and a
  history line torn by the kill is cut off. Temporary files name their process
  (``staging.owned_name``) and are removed once it is dead. Tested by SIGKILLing the commands
  at random points (tests/store/test_kill_during_write.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aieng.errors import ModelNotFoundError, StoreError, VerificationError
from aieng.store.hashing import compare_hashes
from aieng.store.manifest import MANIFEST_TMP_PREFIX, Manifest, write_json_atomic
from aieng.store.refs import ModelRef, check_name
from aieng.store.registration import register
from aieng.store.staging import fsync_dir, remove_dead
from aieng.store.stamps import default_actor, utc_now


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

    def intent_path(self, name: str) -> Path:
        return self.model_dir(name) / ".switch.json"

    @contextlib.contextmanager
    def _lock(self, name: str):
        """The model's exclusive lock; whoever takes it first finishes what a killed writer left."""
        directory = self.model_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                self._recover(name)
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _recover(self, name: str) -> None:
        """Complete or undo an interrupted switch and remove a dead writer's leftovers (under the lock)."""
        directory = self.model_dir(name)
        versions = directory / "versions"
        for leftover in directory.glob(".current-*"):  # a link made but never renamed over `current`
            leftover.unlink(missing_ok=True)
        if versions.is_dir():
            for doomed in versions.glob(".removing-*"):  # a remove killed mid-delete
                shutil.rmtree(doomed, ignore_errors=True)
            remove_dead(versions, ".registering-")
            remove_dead(versions, MANIFEST_TMP_PREFIX)
        self._repair_history_tail(name)
        intent = self.intent_path(name)
        if not intent.is_file():
            return
        try:
            pending = json.loads(intent.read_text())
        except ValueError:  # cannot be half-written (atomic rename), but never trust a crash
            intent.unlink()
            return
        if self.current(name) == pending["event"]["to"]:
            self._finish_switch(name, pending)  # the link moved: finish the bookkeeping
        else:
            intent.unlink()  # killed before the link moved: nothing happened

    def _repair_history_tail(self, name: str) -> None:
        """Cut a last line that a killed append left without its newline (it never completed)."""
        path = self.history_path(name)
        if not path.is_file() or path.stat().st_size == 0:
            return
        with open(path, "rb+") as handle:
            data = handle.read()
            if data.endswith(b"\n"):
                return
            handle.truncate(data.rfind(b"\n") + 1)
            os.fsync(handle.fileno())

    # -- queries -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "versions").is_dir())

    def versions(self, name: str) -> list[str]:
        directory = self.model_dir(name) / "versions"
        if not directory.is_dir():
            return []
        return sorted(
            (p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")), key=_version_key
        )

    def current(self, name: str) -> str | None:
        link = self.model_dir(name) / "current"
        if not link.is_symlink():
            return None
        return Path(os.readlink(link)).name

    def resolve(self, ref: ModelRef) -> str:
        """The concrete version a reference names, or a ModelNotFoundError saying what exists."""
        if ref.name not in self.names():
            known = ", ".join(self.names()) or "none"
            raise ModelNotFoundError(
                f"model {ref.name!r} is not in the store at {self.root} (models: {known}); "
                f"register one with: aieng model register SRC --name {ref.name} --version V"
            )
        if ref.version is None:
            version = self.current(ref.name)
            if version is None:
                raise ModelNotFoundError(
                    f"model {ref.name!r} has no current version; promote one with: aieng model promote {ref.name} V"
                )
            return version
        if ref.version not in self.versions(ref.name):
            raise ModelNotFoundError(
                f"{ref} does not exist; versions of {ref.name}: {', '.join(self.versions(ref.name)) or 'none'}"
            )
        return ref.version

    def path(self, ref: ModelRef) -> Path:
        return self.version_dir(ref.name, self.resolve(ref))

    def manifest(self, ref: ModelRef) -> Manifest:
        return Manifest.read(self.path(ref))

    def suite(self, ref: ModelRef):
        """The eval suite stored with the version (``aieng.evaluation.suite_file.Suite``), or None.
        Its files are covered by the version's hashes: ``verify`` catches an edited suite."""
        from aieng.evaluation.suite_file import load_suite

        entry = self.manifest(ref).suite
        return load_suite(self.path(ref) / entry["file"]) if entry else None

    def history(self, name: str) -> list[dict]:
        path = self.history_path(name)
        if not path.is_file():
            return []
        text = path.read_text()
        if not text.endswith("\n"):  # an append torn by a kill; the next mutation cuts it off
            text = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    # -- register ------------------------------------------------------------------------------
    def register(
        self,
        source: Path | str,
        name: str,
        version: str,
        *,
        provenance: str | None = None,
        suite: Path | str | None = None,
    ) -> Manifest:
        """Copy a safetensors model folder into the store as ``name@version`` (status ``candidate``),
        with its eval suite (``suite``, or the folder's ``eval-suite/suite.yaml``)."""
        return register(self, source, name, version, provenance=provenance, suite=suite)

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
    def promote(
        self,
        name: str,
        version: str,
        *,
        reason: str = "promote",
        actor: str | None = None,
        check: Callable[[str | None], dict | None] | None = None,
    ) -> dict:
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
            # the latest earlier promotion of another version (promoting the current one again is no step)
            earlier = [v for v in self._promotion_stack(name)[:-1] if v in self.versions(name) and v != current]
            if current is None or not earlier:
                raise StoreError(
                    f"{name} has no previous promoted version to roll back to "
                    f"(current: {current or 'none'}); promote a version, or name one with --to V"
                )
            return earlier[-1]
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
                del stack[len(stack) - stack[::-1].index(target) :]  # back to its latest entry
            else:
                stack.append(target)
        return stack

    def _switch(
        self, name: str, version: str, *, action: str, reason: str, actor: str | None, gate: dict | None = None
    ) -> dict:
        """Intent, link, bookkeeping: a kill at any point is completed or undone by ``_recover``."""
        directory = self.model_dir(name)
        previous = self.current(name)
        event = {
            "ts": utc_now(),
            "action": action,
            "from": previous,
            "to": version,
            "reason": reason,
            "actor": actor or default_actor(),
            "id": uuid.uuid4().hex[:12],
        }
        if gate is not None:
            event["gate"] = gate
        pending = {
            "event": event,
            "retire": previous if action == "rollback" and previous not in (None, version) else None,
        }
        write_json_atomic(self.intent_path(name), pending)
        fsync_dir(directory)
        tmp_link = directory / f".current-{uuid.uuid4().hex[:8]}"
        os.symlink(Path("versions") / version, tmp_link)
        os.replace(tmp_link, directory / "current")
        fsync_dir(directory)
        self._finish_switch(name, pending)
        return event

    def _finish_switch(self, name: str, pending: dict) -> None:
        """Statuses and the history line of a switch whose link has moved; safe to run twice."""
        event = pending["event"]
        gate = event.get("gate")
        self._set_fields(name, event["to"], status="stable", **({"release_gate": gate} if gate is not None else {}))
        if pending.get("retire"):
            self._set_fields(name, pending["retire"], status="retired")
        if not any(e.get("id") == event["id"] for e in self.history(name)[-3:]):
            self._append_history(name, event)
        self.intent_path(name).unlink(missing_ok=True)
        fsync_dir(self.model_dir(name))

    def _append_history(self, name: str, event: dict) -> None:
        self._repair_history_tail(name)
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
        """Set mutable fields (``eval``, ``comparison``, ``served_answers``, ``performance_baseline``,
        ``status``); hashes and the stored suite are never touched."""
        allowed = {"eval", "comparison", "served_answers", "performance_baseline", "status"}
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
