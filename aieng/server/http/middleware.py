"""Cross-cutting HTTP concerns: trace ids, timing, the body-size limit, request metrics."""

from __future__ import annotations

import json
import time

from aieng.errors import RequestTooLargeError
from aieng.observability import metrics
from aieng.observability import tracing


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
        context = tracing.from_headers(headers.get(b"traceparent", b"").decode("latin-1"),
                                       headers.get(b"x-request-id", b"").decode("latin-1"))
        token = tracing.current.set(context)
        version_token = metrics.serving_version.set((self.model_version() if self.model_version else None) or "")
        scope.setdefault("state", {})["trace"] = context
        status_holder = {"code": 500, "version": None}

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                status_holder["code"] = message["status"]
                elapsed = time.perf_counter() - start
                extra = [(b"x-request-id", context.request_id.encode("latin-1")),
                         (b"x-trace-id", context.trace_id.encode("latin-1")),
                         (b"x-process-time", f"{elapsed:.6f}".encode())]
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"server-timing" for name, _ in headers):  # a stream: only this is known
                    extra.append((b"server-timing", f'headers;dur={elapsed * 1000:.1f};desc="time to the response '
                                                    f'headers; a stream\'s tokens follow"'.encode()))
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
    """Refuse bodies over ``max_bytes`` with 413 before they are parsed, whatever Content-Length claims."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await self._reject(send)

    async def _reject(self, send):
        error = RequestTooLargeError(f"request body exceeds the limit of {self.max_bytes} bytes")
        metrics.count_error(error.code)
        body = json.dumps(error.envelope()).encode()
        await send({"type": "http.response.start", "status": error.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(Exception):
    pass
