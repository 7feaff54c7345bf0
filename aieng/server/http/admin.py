"""Admin routes: ``POST /admin/reload`` (hot-swap this worker to the store's ``current``) and
``GET /admin/status`` (what this worker serves; read-only, so a runbook can prove its token works
before it changes anything).

Installed only when ``AIENG_ADMIN_TOKEN`` is set, so a server started without one has no admin
surface at all (404). The bearer token is compared in constant time (``hmac.compare_digest``):
a missing or malformed ``Authorization`` header is 401, a wrong token 403.
"""

from __future__ import annotations

import asyncio
import hmac
import os

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from aieng.errors import ForbiddenError, UnauthorizedError
from aieng.server.process.gpu_worker import canary_room


def check_token(header: str | None, token: str) -> None:
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise UnauthorizedError("admin routes need `Authorization: Bearer <AIENG_ADMIN_TOKEN>`")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ForbiddenError("wrong admin token")


def install_admin_routes(app: FastAPI, runtime) -> None:
    @app.get("/admin/status")
    async def status(request: Request):
        """This worker's model, version, canary and last hot swap. Changes nothing: its use is a
        pre-check that the caller's token is the server's before a store write the server must follow."""
        check_token(request.headers.get("authorization"), runtime.settings.admin_token)
        swap, keeper = runtime.swapper.last, runtime.swapper.canary
        return {
            "model": runtime.model_name,
            "version": runtime.model_version,
            "pid": os.getpid(),
            "canary": keeper.describe() if runtime.canary is not None else None,
            "canary_failed": {"version": keeper.failed, "reason": keeper.failed_reason} if keeper.failed else None,
            "canary_room": canary_room(runtime),  # on a GPU: what a canary may take; None elsewhere
            "swap": swap.to_dict() if swap is not None else None,
        }

    @app.post("/admin/reload")
    async def reload(request: Request):
        """Swap this worker to the store's ``current`` now and answer when done (other workers
        follow within ``AIENG_RELOAD_POLL_S``). 200 swapped or unchanged; 409 when the new
        version failed to verify, load or warm up (the old one keeps serving)."""
        check_token(request.headers.get("authorization"), runtime.settings.admin_token)
        outcome = await asyncio.to_thread(runtime.swapper.check, forced=True)
        status = {"swapped": 200, "unchanged": 200, "busy": 503}.get(outcome.status, 409)
        headers = {"Retry-After": "1"} if status == 503 else None  # starting or mid-swap: ask again
        return JSONResponse(outcome.to_dict(), status_code=status, headers=headers)
