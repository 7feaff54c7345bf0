"""Server-sent events in OpenAI's streaming format: ``data: {chunk}`` lines, then ``data: [DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from aieng.observability import metrics
from aieng.engine import TokenEvent
from aieng.engine.sampling import TokenLogprobs
from aieng.engine.token_text import TokenTexts
from aieng.server.http.logprobs import chat_logprobs, completion_logprobs


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


async def stream_chunks(events: AsyncIterator[TokenEvent], *, chat: bool, response_id: str, created: int,
                        model: str, include_usage: bool, logprobs: TokenTexts | None = None,
                        echo: str = "") -> AsyncIterator[str]:
    """Turn engine events into OpenAI chunks. Errors mid-stream become an ``error`` chunk.

    ``logprobs``: the tokenizer's token texts when the request asked for logprobs (each chunk then
    carries those of the tokens since the previous chunk); ``echo``: a completion's prompt, sent
    first."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": response_id, "object": kind, "created": created, "model": model}
    last: TokenEvent | None = None
    pending: list[TokenLogprobs] = []  # logprobs of tokens whose text is not sent yet
    offset = len(echo)  # completions' text_offset of the next token
    if chat:
        yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]})
    elif echo:
        yield sse({**base, "choices": [{"index": 0, "text": echo, "logprobs": None, "finish_reason": None}]})
    async for event in events:
        last = event
        if event.error is not None:  # the status line is long gone: report the error in the stream
            metrics.count_error(event.error.code)
            yield sse(event.error.envelope())
            break
        if event.logprobs is not None:
            pending.append(event.logprobs)
        if not event.text and not event.finished:
            continue
        finish = event.finish_reason if event.finished else None
        chosen = None
        if logprobs is not None and pending:
            if chat:
                chosen = chat_logprobs(pending, logprobs)
            else:
                chosen = completion_logprobs(pending, logprobs, offset=offset)
                offset = chosen["text_offset"][-1] + len(chosen["tokens"][-1])
            pending = []
        if chat:
            delta = {"content": event.text} if event.text else {}
            choice = {"index": 0, "delta": delta, "logprobs": chosen, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": event.text, "logprobs": chosen, "finish_reason": finish}
        yield sse({**base, "choices": [choice]})
    if include_usage and last is not None and last.error is None:
        usage = {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
                 "total_tokens": last.prompt_tokens + last.completion_tokens}
        yield sse({**base, "choices": [], "usage": usage})
    yield sse("[DONE]")
