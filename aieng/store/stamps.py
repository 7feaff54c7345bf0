"""When and who: the timestamp and the actor every store record carries (manifests, history,
the canary record), in one format."""

from __future__ import annotations

import getpass
import os
from datetime import UTC, datetime


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def default_actor() -> str:
    try:
        return os.environ.get("AIENG_ACTOR") or getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return f"uid:{os.getuid()}"
