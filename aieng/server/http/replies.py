"""A whole (not streamed) reply's choices: text, finish reason, logprobs and the guard's verdict.

The streamed counterpart is ``sse.stream_chunks``; both read the same pieces of a finished
``Submission`` (``bridge``), one choice per ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass

from aieng.engine.token_text import TokenTexts
from aieng.server.http.bridge import Submission
from aieng.server.http.logprobs import TextOffsets, chat_logprobs, completion_logprobs
from aieng.server.http.output_guard import OutputGuard, Verdict, record
from aieng.server.http.schemas import AssistantMessage, ChatChoice, CompletionChoice


@dataclass
class ReplyOptions:
    chat: bool
    texts: TokenTexts | None  # the tokenizer's token texts when the request asked for logprobs
    echo: str = ""  # a completion's prompt, before its text
    scored: tuple | list = ()  # the prompt's ids when echo came with logprobs
    guard: OutputGuard | None = None
    guard_prompt: str = ""
    constrained: bool = False  # the guard's format checks skip it
    trace_id: str | None = None
    prompt_ids: tuple | list | None = None  # return_token_ids: the prompt's ids, sent beside each choice's own
    context_ids: tuple | list = ()  # the prompt's ids, always: the choices' text is decoded after them
    verdict: Verdict | None = None  # a stream's first guard verdict, set by sse.stream_chunks (for capture)


def reply_choices(submission: Submission, options: ReplyOptions) -> tuple[list[dict], Verdict | None]:
    """Every choice as OpenAI's JSON (with a ``guard`` field where the guard fired), and the first verdict."""
    choices, first = [], None
    for index in range(submission.request.params.n):
        text, finish_reason = "".join(submission.texts.get(index, [])), submission.finishes.get(index)
        items = submission.logprobs.get(index, [])
        verdict = None
        if options.guard is not None:
            verdict = options.guard.check(options.guard_prompt, text, constrained=options.constrained)
        if verdict is not None:
            record(verdict, trace_id=options.trace_id)
            first = first or verdict
            if verdict.action == "fallback":
                text, finish_reason, items = options.guard.fallback, "content_filter", []
        choice = _choice(index, text, finish_reason, items, submission, options)
        if options.prompt_ids is not None:  # vLLM's shape: chat names the prompt's ids once, at the top
            choice["token_ids"] = submission.token_ids.get(index, [])
            if not options.chat:
                choice["prompt_token_ids"] = list(options.prompt_ids)
        if verdict is not None:
            choice["guard"] = verdict.field()  # an extension, beside OpenAI's fields
        choices.append(choice)
    return choices, first


def _choice(
    index: int, text: str, finish_reason: str | None, items, submission: Submission, options: ReplyOptions
) -> dict:
    texts = options.texts
    if options.chat:
        logprobs = chat_logprobs(items, texts) if texts is not None else None
        return ChatChoice(
            index=index, message=AssistantMessage(content=text), finish_reason=finish_reason, logprobs=logprobs
        ).model_dump()
    logprobs = None
    if texts is not None:
        offsets = TextOffsets(texts, len(options.echo), prompt_ids=options.context_ids)
        logprobs = completion_logprobs(
            items, texts, offsets, prompt=options.scored, prompt_items=submission.prompt_logprobs or ()
        )
    return CompletionChoice(
        index=index, text=options.echo + text, logprobs=logprobs, finish_reason=finish_reason
    ).model_dump()
