"""Trace and request ids: where they come from and how they follow a request.

``trace_id`` comes from a W3C ``traceparent`` header when present (so aieng's log lines join the
caller's trace), else from ``X-Request-ID``, else it is generated. It lives in a context variable
for the event loop's code; the engine thread gets it explicitly with each request.
"""

from __future__ import annotations

import contextvars
import re
import uuid
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    request_id: str


current: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar("aieng_trace", default=None)


def from_headers(traceparent: str | None, request_id_header: str | None) -> TraceContext:
    request_id = request_id_header if request_id_header and _SAFE_ID.match(request_id_header) else uuid.uuid4().hex
    match = _TRACEPARENT.match((traceparent or "").strip().lower())
    if match and match.group(1) != "0" * 32:
        return TraceContext(trace_id=match.group(1), request_id=request_id)
    return TraceContext(trace_id=request_id, request_id=request_id)
