"""Cross-cutting HTTP concerns: trace ids, timing, the body-size limit, request metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aieng.errors import RequestTooLargeError, SlowClientError
from aieng.observability import metrics, tracing

log = logging.getLogger("aieng.server")


class RequestContextMiddleware:
    """Trace context in, ``X-Request-ID`` / ``X-Trace-ID`` / ``X-Process-Time`` out, requests counted.

    ``X-Process-Time`` is the time to the response headers: all of the work for a whole reply,
    only the part before the first token for a stream. A whole generation reply sets its own
    ``Server-Timing`` (queue, prefill, decode); every other response, streams included, gets
    ``Server-Timing: headers;dur=…`` saying which of the two it is.

    Pure ASGI rather than ``BaseHTTPMiddleware`` so streaming responses are not buffered; the
    duration therefore covers the whole stream.
    """

    def __init__(self, app, *, metrics_enabled: bool = True, model_version=None):
        self.app = app
        self.metrics_enabled = metrics_enabled
        # () -> the worker's serving version: ``X-Model-Version`` on responses whose route did not
        # set its own (generation routes name the version that served them, even mid-swap)
        self.model_version = model_version

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        headers = dict(scope.get("headers") or [])
        context = tracing.from_headers(
            headers.get(b"traceparent", b"").decode("latin-1"), headers.get(b"x-request-id", b"").decode("latin-1")
        )
        token = tracing.current.set(context)
        version_token = metrics.serving_version.set((self.model_version() if self.model_version else None) or "")
        scope.setdefault("state", {})["trace"] = context
        status_holder = {"code": 500, "version": None}

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                status_holder["code"] = message["status"]
                elapsed = time.perf_counter() - start
                extra = [
                    (b"x-request-id", context.request_id.encode("latin-1")),
                    (b"x-trace-id", context.trace_id.encode("latin-1")),
                    (b"x-process-time", f"{elapsed:.6f}".encode()),
                ]
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"server-timing" for name, _ in headers):  # a stream: only this is known
                    extra.append(
                        (
                            b"server-timing",
                            f'headers;dur={elapsed * 1000:.1f};desc="time to the response '
                            f"headers; a stream's tokens follow\"".encode(),
                        )
                    )
                version = self.model_version() if self.model_version else None
                named = [value for name, value in headers if name.lower() == b"x-model-version"]
                if named:
                    status_holder["version"] = named[0].decode("latin-1")
                elif version:
                    extra.append((b"x-model-version", version.encode("latin-1")))
                message = {**message, "headers": headers + extra}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            tracing.current.reset(token)
            version = status_holder["version"] or metrics.serving_version.get()
            metrics.serving_version.reset(version_token)
            if self.metrics_enabled:
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"
                metrics.REQUESTS.labels(route=path, code=str(status_holder["code"]), version=version).inc()
                metrics.REQUEST_DURATION.labels(route=path, version=version).observe(time.perf_counter() - start)


class BodySizeLimitMiddleware:
    """Refuse bodies over ``max_bytes`` with 413 before they are parsed, whatever Content-Length
    claims, and bodies still arriving ``timeout_s`` after the request began with 408 (a client
    sending a byte a second would otherwise hold its connection and its handler for as long as
    it likes; the deadline covers the body only, not the disconnect watch that follows it)."""

    def __init__(self, app, max_bytes: int, timeout_s: float = 0.0):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send, self._too_large())
        received = 0
        body_done = False
        deadline = time.monotonic() + self.timeout_s

        async def limited_receive():
            nonlocal received, body_done
            if body_done or self.timeout_s <= 0:
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    raise _BodyTooSlow() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_bytes:
                    raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await self._reject(send, self._too_large())
        except _BodyTooSlow:
            log.warning(
                "request body not complete after %g s: answered 408",
                self.timeout_s,
                extra={"event": "slow_client", "phase": "body", "received_bytes": received},
            )
            await self._reject(
                send,
                SlowClientError(
                    f"the request body did not arrive within {self.timeout_s:g} s "
                    f"(AIENG_BODY_TIMEOUT_S); {received} bytes came"
                ),
                close=True,
            )

    def _too_large(self) -> RequestTooLargeError:
        return RequestTooLargeError(f"request body exceeds the limit of {self.max_bytes} bytes")

    async def _reject(self, send, error, *, close: bool = False):
        metrics.count_error(error.code)
        body = json.dumps(error.envelope()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": headers + ([(b"connection", b"close")] if close else []),
            }
        )
        await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(BaseException):
    """BaseException so that no layer in between (FastAPI turns an Exception raised while it
    parses the body into a 400 "error parsing the body") catches it before this middleware."""


class _BodyTooSlow(BaseException):
    """As ``_BodyTooLarge``."""
