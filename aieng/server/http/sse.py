"""Server-sent events in OpenAI's streaming format: ``data: {chunk}`` lines, then ``data: [DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from aieng.observability import metrics
from aieng.engine import TokenEvent


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


async def stream_chunks(events: AsyncIterator[TokenEvent], *, chat: bool, response_id: str, created: int,
                        model: str, include_usage: bool) -> AsyncIterator[str]:
    """Turn engine events into OpenAI chunks. Errors mid-stream become an ``error`` chunk."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": response_id, "object": kind, "created": created, "model": model}
    last: TokenEvent | None = None
    if chat:
        yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]})
    async for event in events:
        last = event
        if event.error is not None:  # the status line is long gone: report the error in the stream
            metrics.count_error(event.error.code)
            yield sse(event.error.envelope())
            break
        if not event.text and not event.finished:
            continue
        finish = event.finish_reason if event.finished else None
        if chat:
            delta = {"content": event.text} if event.text else {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": event.text, "logprobs": None, "finish_reason": finish}
        yield sse({**base, "choices": [choice]})
    if include_usage and last is not None and last.error is None:
        usage = {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
                 "total_tokens": last.prompt_tokens + last.completion_tokens}
        yield sse({**base, "choices": [], "usage": usage})
    yield sse("[DONE]")
