"""Whether the server has room for a canary, asked before the release writes anything, and why a
canary did not load, read as soon as the server knows.

On a GPU each worker keeps room for a canary beside the stable version (the stable version's
weights' worth, and ``AIENG_CANARY_KV_SHARE`` of the KV budget) and says how much in ``GET
/admin/status`` (``canary_room``). A canary that cannot fit is refused here, before the store's
record moves; one that fails to load anyway (bad weights, a real out-of-memory) is reported by the
worker (``canary_failed``) and the release stops at once instead of waiting out its deadline.
"""

from __future__ import annotations

import os

import httpx

from aieng.host.gpus import canary_fit_problem
from aieng.store import ModelRef, ModelStore


def _status(url: str, token: str | None) -> dict | None:
    token = token if token is not None else os.environ.get("AIENG_ADMIN_TOKEN", "")
    try:
        answer = httpx.get(f"{url.rstrip('/')}/admin/status", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    except httpx.HTTPError:
        return None  # the reload that follows says what is wrong with the server, in its words
    return answer.json() if answer.status_code == 200 else None


def room_refusal(store: ModelStore, name: str, version: str, url: str, token: str | None) -> str | None:
    """Why ``name@version`` cannot be a canary on the server at ``url``; None when it fits or the
    server keeps no GPU room to judge by (a CPU host: the load's own memory check applies)."""
    room = (_status(url, token) or {}).get("canary_room")
    if not room:
        return None
    return canary_fit_problem(room, store.manifest(ModelRef(name, version)).num_parameters)


class CanaryLoadFailed(TimeoutError):
    """A worker said it could not load the canary: waiting longer would change nothing."""


def load_failure(url: str, token: str | None, version: str) -> str | None:
    """The answering worker's reason when it failed to load canary ``version``."""
    failed = (_status(url, token) or {}).get("canary_failed") or {}
    return failed.get("reason") if failed.get("version") == version else None
