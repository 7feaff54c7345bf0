"""The canary record: which version serves beside ``current``, and with what share of traffic.

Why in the store, like ``current``: a server has several workers and an admin request reaches
one of them. Every worker converges on the store instead (it checks on each reload poll and on
``POST /admin/reload``), so all of them split traffic the same way, and a restarted worker picks
the canary up again. ``<name>/canary.json`` is replaced by renaming a complete temp file over it
(atomic on POSIX), under the model's lock; every change is a history event (``canary_set``,
``canary_cleared``), so ``aieng model history`` shows a canary's steps.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from aieng.errors import InvalidRequestError
from aieng.store.refs import ModelRef
from aieng.store.staging import fsync_dir
from aieng.store.stamps import default_actor, utc_now
from aieng.store.store import ModelStore


@dataclass(frozen=True)
class CanaryRecord:
    version: str
    weight: float  # share of requests without a pinned version, 0..1

    def to_dict(self) -> dict:
        return asdict(self)


def canary_path(store: ModelStore, name: str) -> Path:
    return store.model_dir(name) / "canary.json"


def read_canary(store: ModelStore, name: str) -> CanaryRecord | None:
    """The canary of ``name``, or None (no record, or one naming the current version)."""
    try:
        data = json.loads(canary_path(store, name).read_text())
    except (FileNotFoundError, ValueError):
        return None
    record = CanaryRecord(str(data["version"]), float(data["weight"]))
    return None if record.version == store.current(name) else record


def set_canary(
    store: ModelStore, name: str, version: str, weight: float, *, reason: str = "canary", actor: str | None = None
) -> dict:
    """Serve ``version`` beside ``current`` to ``weight`` of the traffic (0 keeps it loaded, idle)."""
    if not 0.0 <= weight <= 1.0:
        raise InvalidRequestError(f"a canary weight is a share between 0 and 1, got {weight}", param="weight")
    store.verify_or_raise(ModelRef(name, store.resolve(ModelRef(name, version))))
    if version == store.current(name):
        raise InvalidRequestError(
            f"{name}@{version} is already the current version: nothing to canary", param="version"
        )
    event = {
        "ts": utc_now(),
        "action": "canary_set",
        "from": store.current(name),
        "to": version,
        "weight": weight,
        "reason": reason,
        "actor": actor or default_actor(),
    }
    with store._lock(name):
        _write(canary_path(store, name), CanaryRecord(version, weight).to_dict())
        store._append_history(name, event)
    return event


def clear_canary(
    store: ModelStore, name: str, *, reason: str = "canary cleared", actor: str | None = None
) -> dict | None:
    """Stop serving the canary (workers unload it); None when there was none."""
    path = canary_path(store, name)
    with store._lock(name):
        if not path.exists():
            return None
        previous = json.loads(path.read_text()).get("version")
        path.unlink()
        fsync_dir(path.parent)
        event = {
            "ts": utc_now(),
            "action": "canary_cleared",
            "from": previous,
            "to": store.current(name),
            "reason": reason,
            "actor": actor or default_actor(),
        }
        store._append_history(name, event)
    return event


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
