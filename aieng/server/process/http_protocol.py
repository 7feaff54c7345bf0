"""uvicorn's HTTP protocol with the two limits it lacks: a header deadline and an enveloped 503.

Why: uvicorn closes idle keep-alive connections, but a client that opens a connection and then
sends its request line and headers a byte at a time (slowloris), or nothing at all, holds the
connection, and a slot of the per-worker connection cap, for as long as it likes. nginx cuts such
clients with ``client_header_timeout`` (60 s); here ``AIENG_HEADER_TIMEOUT_S`` does the same:
a connection whose request headers are not complete that long after it opened (or after the
previous response) gets a 408 in the error envelope and is closed.

Beyond ``AIENG_MAX_CONNECTIONS`` concurrent connections (or requests) a worker answers 503
before reading the body; uvicorn's own answer is plain text, so the module swaps in one that
carries aieng's error envelope and ``Retry-After`` (uvicorn's protocol module looks the handler
up by name at each request, which is what makes the swap possible).
"""

from __future__ import annotations

import json
import logging

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aieng.errors import ConnectionLimitError, SlowClientError

log = logging.getLogger("aieng.server")


def _body(error) -> bytes:
    from aieng.observability import metrics

    metrics.count_error(error.code)
    return json.dumps(error.envelope()).encode()


async def connection_limit_reached(scope, receive, send) -> None:
    """The 503 a worker gives beyond its connection cap, in the error envelope."""
    body = _body(
        ConnectionLimitError(
            "this worker is at its connection limit (AIENG_MAX_CONNECTIONS); retry shortly or on another instance"
        )
    )
    await send(
        {
            "type": "http.response.start",
            "status": ConnectionLimitError.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


httptools_impl.service_unavailable = connection_limit_reached


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` plus the header deadline (``config.header_timeout_s``; 0 = none)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.header_timeout_s = getattr(config, "header_timeout_s", 0.0)
        self._header_timer = None
        self.idle_since: float | None = None  # loop time since no request is in progress (a retiring worker reads it)

    def _arm_header_timer(self) -> None:
        if self.header_timeout_s > 0 and self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.idle_since = self.loop.time()
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.idle_since = None
        self._arm_header_timer()  # the next request on a kept-alive connection gets its own deadline

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:
            self.idle_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return  # a request is being answered: its headers were complete after all
        log.warning(
            "closed a connection whose request headers took over %g s",
            self.header_timeout_s,
            extra={"event": "slow_client", "phase": "headers", "client": "%s:%s" % (self.client or ("?", "?"))},
        )
        body = _body(
            SlowClientError(
                f"the request headers did not arrive within {self.header_timeout_s:g} s (AIENG_HEADER_TIMEOUT_S)"
            )
        )
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.transport.close()
