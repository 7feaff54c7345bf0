"""Notice a client that gave up on a non-streaming request, and stop generating for it.

A streaming response notices a gone client when a write fails; a non-streaming one writes only
at the end, so it would generate to ``max_tokens`` for nobody. After the body is read, the ASGI
``receive`` callable's next message is ``http.disconnect``: awaiting it beside the result is how
the server notices.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def unless_disconnected(result: Awaitable, receive):
    """``await result``, or None if the client disconnects first (``result`` is then cancelled)."""
    result_task = asyncio.ensure_future(result)
    disconnect_task = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({result_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
        if result_task in done:
            return result_task.result()
        result_task.cancel()  # e.g. the bridge's events iterator: its finally cancels the row
        try:
            await result_task
        except asyncio.CancelledError:
            pass
        return None
    finally:
        disconnect_task.cancel()


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
