"""Tell a running server to hot-swap, and confirm every worker did (``--reload URL``).

``POST /admin/reload`` swaps the worker that receives it; the others follow the store's
``current`` within ``AIENG_RELOAD_POLL_S``. So success is read from ``/metrics``, where
``aieng_model_info`` has one sample per live worker: done when every worker serves the version.
"""

from __future__ import annotations

import os
import time

import httpx

from aieng.errors import ConfigError, ReloadError
from aieng.observability.scrape import scrape


def worker_versions(base_url: str) -> dict[str, str]:
    """pid -> the version each live worker serves."""
    return {
        dict(labels).get("pid", "-"): dict(labels)["version"]
        for (name, labels), value in scrape(base_url).samples.items()
        if name == "aieng_model_info" and value == 1
    }


def worker_canaries(base_url: str) -> dict[str, tuple[str, float]]:
    """pid -> (canary version, weight) of each live worker with a canary loaded (at weight 0 too:
    loaded for a shadow probe, answering only requests pinned to it)."""
    samples = scrape(base_url).samples
    weights = {
        (dict(labels).get("pid", "-"), dict(labels)["version"]): value
        for (name, labels), value in samples.items()
        if name == "aieng_canary_weight"
    }
    return {
        pid: (version, weights.get((pid, version), 0.0))
        for pid, version in (
            (dict(labels).get("pid", "-"), dict(labels)["version"])
            for (name, labels), value in samples.items()
            if name == "aieng_canary_loaded" and value == 1
        )
    }


def check_reloadable(base_url: str, token: str | None = None, *, model: str | None = None) -> dict:
    """Before a store write that a server must follow: the admin token is set, the server answers
    and accepts that token (``GET /admin/status``, read-only), and serves ``model`` when given.
    A store that moved while its server cannot follow is worse than neither moving, so a runbook
    calls this first. Returns the answering worker's status; raises ConfigError saying what to fix."""
    token = token if token is not None else os.environ.get("AIENG_ADMIN_TOKEN", "")
    if not token:
        raise ConfigError("AIENG_ADMIN_TOKEN is unset: the hot swap would fail after the store moved")
    base_url = base_url.rstrip("/")
    try:
        live = httpx.get(f"{base_url}/health/live", timeout=10).status_code
        answer = httpx.get(f"{base_url}/admin/status", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    except httpx.HTTPError as exc:
        raise ConfigError(f"{base_url} does not answer ({exc}): fix the URL, or run without server_url") from None
    if live != 200:
        raise ConfigError(f"{base_url}/health/live answers {live}: the server is not live")
    if answer.status_code == 404:
        raise ConfigError(
            f"{base_url} has no admin routes: it was started without AIENG_ADMIN_TOKEN, so it cannot be "
            "told to swap; restart it with one, or run without server_url (it follows the store by polling)"
        )
    if answer.status_code in (401, 403):
        raise ConfigError(
            f"{base_url} refuses this AIENG_ADMIN_TOKEN ({answer.status_code}): "
            "set the token the server was started with"
        )
    status = answer.json()
    if model is not None and status.get("model") != model:
        raise ConfigError(f"{base_url} serves {status.get('model')!r}, not {model!r}: wrong server_url?")
    return status


def admin_reload(
    base_url: str, token: str | None = None, *, timeout_s: float = 600.0, version: str | None = None
) -> dict:
    """``POST /admin/reload``: the worker that answers re-reads the store (current and canary) at
    once; the others follow within their poll. Returns its outcome; raises ReloadError.

    A 503 means the answering worker is busy (still starting, or another swap holds its lock):
    a passing state, so it is asked again, after its ``Retry-After``, until ``timeout_s``. A
    worker that refuses the version (409) is final: the old version keeps serving."""
    token = token if token is not None else os.environ.get("AIENG_ADMIN_TOKEN", "")
    if not token:
        raise ConfigError("reloading a server needs the server's admin token in AIENG_ADMIN_TOKEN")
    base_url = base_url.rstrip("/")
    deadline = time.monotonic() + timeout_s
    while True:
        answer = _post_reload(base_url, token, timeout_s=max(1.0, deadline - time.monotonic()))
        body = answer.json()
        if answer.status_code != 503 or time.monotonic() >= deadline:
            break
        time.sleep(min(_retry_after_s(answer), max(0.0, deadline - time.monotonic())))
    if answer.status_code == 503:
        raise ReloadError(
            f"{base_url} stayed busy for {timeout_s:.0f} s ({body.get('error')}): the store says "
            f"{version or body.get('version')}; the server follows within AIENG_RELOAD_POLL_S once free, "
            "or run the reload again"
        )
    if answer.status_code != 200:
        raise ReloadError(
            f"the server refused {version or body.get('version')}: {body.get('error') or body}; it "
            f"keeps serving {body.get('previous')}. Roll the store back (`aieng model rollback`) so "
            "they agree"
        )
    return body


def _post_reload(base_url: str, token: str, *, timeout_s: float) -> httpx.Response:
    try:
        answer = httpx.post(f"{base_url}/admin/reload", headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ReloadError(
            f"could not reach {base_url}/admin/reload ({exc}); the store was switched, the server "
            "will follow within AIENG_RELOAD_POLL_S if it polls"
        ) from exc
    if answer.status_code in (401, 403, 404):
        raise ReloadError(
            f"{base_url}/admin/reload answered {answer.status_code}: the server needs "
            "AIENG_ADMIN_TOKEN set, and the same token here"
        )
    return answer


def _retry_after_s(answer: httpx.Response, default_s: float = 0.5) -> float:
    try:
        return min(5.0, max(0.1, float(answer.headers.get("retry-after", default_s))))
    except ValueError:
        return default_s


def reload_server(
    base_url: str, version: str, *, token: str | None = None, timeout_s: float = 600.0, poll_s: float = 0.5
) -> dict[str, str]:
    """Ask ``base_url`` to swap to ``version`` (the store's ``current``) and wait until every
    worker serves it. Returns pid -> version; raises ReloadError naming what went wrong."""
    admin_reload(base_url, token, timeout_s=timeout_s, version=version)
    base_url = base_url.rstrip("/")
    deadline = time.monotonic() + timeout_s
    while True:
        versions = worker_versions(base_url)
        if versions and set(versions.values()) == {version}:
            return versions
        if time.monotonic() > deadline:
            raise ReloadError(
                f"not every worker serves {version} after {timeout_s:.0f} s: {versions}; "
                "see /health/ready's `swap` field and the server log"
            )
        time.sleep(poll_s)
