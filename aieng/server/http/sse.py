"""Server-sent events in OpenAI's streaming format: ``data: {chunk}`` lines, then ``data: [DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from aieng.observability import metrics
from aieng.engine import TokenEvent
from aieng.engine.sampling import TokenLogprobs
from aieng.engine.token_text import TokenTexts
from aieng.server.http.logprobs import chat_logprobs, completion_logprobs
from aieng.server.http.output_guard import OutputGuard, Verdict, record


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


async def stream_chunks(events: AsyncIterator[TokenEvent], *, chat: bool, response_id: str, created: int,
                        model: str, include_usage: bool, logprobs: TokenTexts | None = None,
                        echo: str = "", guard: OutputGuard | None = None, guard_prompt: str = "",
                        constrained: bool = False, trace_id: str | None = None) -> AsyncIterator[str]:
    """Turn engine events into OpenAI chunks. Errors mid-stream become an ``error`` chunk.

    ``logprobs``: the tokenizer's token texts when the request asked for logprobs (each chunk then
    carries those of the tokens since the previous chunk); ``echo``: a completion's prompt, sent
    first. ``guard``: the output guard; the blocklist and hook look at the text before each chunk
    leaves (a hit, with ``fallback``, ends the stream with ``content_filter`` instead of that
    chunk); the answer's format is judged at the end, and can only be flagged there."""
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
    sent, verdict = "", None  # the answer's text so far; the guard's verdict once one fired
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
        fired = None
        if guard is not None and verdict is None:
            fired = guard.check_partial(guard_prompt, sent + event.text)
            if fired is None and event.finished:
                found = guard.check(guard_prompt, sent + event.text, constrained=constrained)
                fired = found and Verdict(found.check, found.reason, "flag")  # sent already: it can only be marked
            if fired is not None:
                verdict = fired
                record(fired, trace_id=trace_id)
                if fired.action == "fallback":  # withhold this chunk and end the stream
                    delta = {"delta": {}} if chat else {"text": ""}
                    yield sse({**base, "choices": [{"index": 0, **delta, "logprobs": None,
                                                    "finish_reason": "content_filter", "guard": fired.field()}]})
                    await events.aclose()  # cancels the request: its tokens would go nowhere
                    break
        sent += event.text
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
        if fired is not None:
            choice["guard"] = fired.field()
        yield sse({**base, "choices": [choice]})
    if include_usage and last is not None and last.error is None and last.finished:
        usage = {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
                 "total_tokens": last.prompt_tokens + last.completion_tokens}
        yield sse({**base, "choices": [], "usage": usage})
    yield sse("[DONE]")
