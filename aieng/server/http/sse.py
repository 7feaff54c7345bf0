"""Server-sent events in OpenAI's streaming format: ``data: {chunk}`` lines, then ``data: [DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aieng.engine import TokenEvent
from aieng.engine.sampling import TokenLogprobs
from aieng.observability import metrics
from aieng.server.http.logprobs import TextOffsets, chat_logprobs, completion_logprobs
from aieng.server.http.output_guard import Verdict, record
from aieng.server.http.replies import ReplyOptions


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


async def stream_chunks(
    events: AsyncIterator[TokenEvent],
    options: ReplyOptions,
    *,
    response_id: str,
    created: int,
    model: str,
    include_usage: bool,
    n: int = 1,
) -> AsyncIterator[str]:
    """Turn engine events into OpenAI chunks; ``options`` are the ones a whole reply takes
    (``replies.ReplyOptions``). Errors mid-stream become an ``error`` chunk.

    With logprobs, each chunk carries those of the tokens since the previous chunk. An echoed
    prompt is sent first; when echo came with logprobs it waits for the first event, which brings
    the prompt's logprobs. The guard's blocklist and hook look at the text before each chunk
    leaves (a hit, with ``fallback``, ends that choice with ``content_filter`` instead of that
    chunk); the answer's format is judged at the end, and can only be flagged there. ``n``
    choices stream interleaved, each chunk naming its ``index``."""
    chat, logprobs, echo, scored_prompt = options.chat, options.texts, options.echo, options.scored
    guard, guard_prompt = options.guard, options.guard_prompt
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": response_id, "object": kind, "created": created, "model": model}
    last: TokenEvent | None = None
    choices = [
        _ChoiceStream(
            offsets=TextOffsets(logprobs, len(echo), prompt_ids=options.context_ids)
            if logprobs is not None and not chat
            else None
        )
        for _ in range(n)
    ]
    ids = options.prompt_ids  # return_token_ids: the prompt's ids with a choice's first chunk, then each chunk's own
    for index in range(n):
        if chat:
            yield sse(
                {
                    **base,
                    **({"prompt_token_ids": list(ids)} if ids is not None and index == 0 else {}),
                    "choices": [
                        {
                            "index": index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
        elif echo and not scored_prompt:
            yield sse(
                {
                    **base,
                    "choices": [
                        {
                            "index": index,
                            "text": echo,
                            "logprobs": None,
                            "finish_reason": None,
                            **choices[index].ids_field(ids),
                        }
                    ],
                }
            )
    async for event in events:
        last = event
        if event.error is not None:  # the status line is long gone: report the error in the stream
            metrics.count_error(event.error.code)
            yield sse(event.error.envelope())
            break
        state = choices[event.index]
        if state.withheld:  # the guard ended this choice; the others go on
            continue
        if event.prompt_logprobs is not None and scored_prompt and logprobs is not None:
            scored = completion_logprobs([], logprobs, prompt=scored_prompt, prompt_items=event.prompt_logprobs)
            yield sse(
                {
                    **base,
                    "choices": [
                        {
                            "index": event.index,
                            "text": echo,
                            "logprobs": scored,
                            "finish_reason": None,
                            **state.ids_field(ids),
                        }
                    ],
                }
            )
        if event.logprobs is not None:
            state.pending.append(event.logprobs)
        if event.token_id is not None:
            state.pending_ids.append(event.token_id)
        if not event.text and event.choice_finish is None:
            continue
        finish = event.choice_finish
        fired = None
        if guard is not None and state.verdict is None and (guard.partial_checks or finish is not None):
            text = "".join(state.sent) + event.text  # joined only when a check reads it
            fired = guard.check_partial(guard_prompt, text)
            if fired is None and finish is not None:
                found = guard.check(guard_prompt, text, constrained=options.constrained)
                fired = found and Verdict(found.check, found.reason, "flag")  # sent already: it can only be marked
            if fired is not None:
                state.verdict = fired
                options.verdict = options.verdict or fired
                record(fired, trace_id=options.trace_id)
                if fired.action == "fallback":  # withhold this chunk and end the choice
                    state.withheld = True
                    delta = {"delta": {}} if chat else {"text": ""}
                    yield sse(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": event.index,
                                    **delta,
                                    "logprobs": None,
                                    "finish_reason": "content_filter",
                                    "guard": fired.field(),
                                }
                            ],
                        }
                    )
                    if all(c.withheld for c in choices):
                        await events.aclose()  # cancels the request: its tokens would go nowhere
                        break
                    continue
        state.sent.append(event.text)
        chosen = None
        if logprobs is not None and state.pending:
            if chat:
                chosen = chat_logprobs(state.pending, logprobs)
            else:
                chosen = completion_logprobs(state.pending, logprobs, state.offsets)
            state.pending = []
        if chat:
            delta = {"content": event.text} if event.text else {}
            choice = {"index": event.index, "delta": delta, "logprobs": chosen, "finish_reason": finish}
        else:
            choice = {"index": event.index, "text": event.text, "logprobs": chosen, "finish_reason": finish}
        if fired is not None:
            choice["guard"] = fired.field()
        choice.update(state.ids_field(ids, chat=chat))
        yield sse({**base, "choices": [choice]})
    if include_usage and last is not None and last.error is None and last.finished:
        usage = {
            "prompt_tokens": last.prompt_tokens,
            "completion_tokens": last.completion_tokens,
            "total_tokens": last.prompt_tokens + last.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": last.cached_tokens},
        }
        yield sse({**base, "choices": [], "usage": usage})
    yield sse("[DONE]")


@dataclass
class _ChoiceStream:
    """One choice's state in a stream."""

    offsets: TextOffsets | None = None  # completions with logprobs: its tokens' text_offset, from token to token
    sent: list[str] = field(default_factory=list)  # its text so far, in pieces
    pending: list[TokenLogprobs] = field(default_factory=list)  # logprobs of tokens whose text is not sent yet
    verdict: Verdict | None = None  # the guard's, once one fired
    withheld: bool = False  # the guard ended it (fallback)
    pending_ids: list[int] = field(default_factory=list)  # ids of tokens whose text is not sent yet
    prompt_sent: bool = False  # return_token_ids: the prompt's ids went out (completions: in the choice)

    def ids_field(self, prompt_ids, *, chat: bool = False) -> dict:
        """return_token_ids' fields for this choice's next chunk (none unless asked), clearing what it sends."""
        if prompt_ids is None:
            return {}
        found = {"token_ids": self.pending_ids}
        self.pending_ids = []
        if not chat and not self.prompt_sent:
            found["prompt_token_ids"] = list(prompt_ids)
        self.prompt_sent = True
        return found
