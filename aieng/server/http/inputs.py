"""From a parsed request body to a validated ``GenerationRequest``, off the event loop.

Tokenizing (and rendering the chat template) is model-side work that would stall every stream
on the event loop, so each request's preparation runs in one worker thread
(``asyncio.to_thread``): render or tokenize, then ``validate_request``, the single validation a
request passes before it is queued.
"""

from __future__ import annotations

import asyncio
import uuid

from aieng.engine import GenerationRequest, SamplingParams, validate_request
from aieng.engine.chat import chat_ids
from aieng.engine.token_text import TokenTexts
from aieng.errors import InvalidRequestError
from aieng.observability import tracing
from aieng.server.http.schemas import ChatCompletionRequest, CompletionRequest


class RequestBuilder:
    """Builds requests for ``engine`` (its tokenizer and context length; nothing runs on it here)."""

    def __init__(self, engine):
        self.encode = engine.encode
        self.tokenizer = engine.tokenizer
        self.context_length = engine.context_length
        self.token_texts = TokenTexts(engine.tokenizer)  # token ids -> text and bytes, for logprobs

    async def completion(self, body: CompletionRequest) -> GenerationRequest:
        if body.echo and body.logprobs is not None:
            raise InvalidRequestError("echo with logprobs would need the prompt's logprobs, which this server does not "
                                      "compute; ask for echo or for logprobs", param="logprobs")
        prompt = single_prompt(body.prompt)

        def build() -> GenerationRequest:
            return self._request(self.encode(prompt), body, body.max_tokens, logprobs=body.logprobs)

        return await asyncio.to_thread(build)

    async def chat(self, body: ChatCompletionRequest) -> GenerationRequest:
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        messages = [{"role": m.template_role(), "content": m.text()} for m in body.messages]

        def build() -> GenerationRequest:
            ids = chat_ids(self.tokenizer, messages)
            # No max_tokens: as much as the context leaves (OpenAI's default for chat).
            max_tokens = body.max_completion_tokens or body.max_tokens or max(1, self.context_length - len(ids))
            return self._request(ids, body, max_tokens, logprobs=(body.top_logprobs or 0) if body.logprobs else None)

        return await asyncio.to_thread(build)

    def _request(self, ids: list[int], body, max_tokens: int, *, logprobs: int | None) -> GenerationRequest:
        params = sampling_params(body, max_tokens, logprobs)
        validate_request(len(ids), params, self.context_length)
        context = tracing.current.get()
        return GenerationRequest(uuid.uuid4().hex, ids, params, trace_id=context.trace_id if context else None)


def sampling_params(body, max_tokens: int, logprobs: int | None = None) -> SamplingParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                          repetition_penalty=body.repetition_penalty, seed=body.seed, stop=stop,
                          ignore_eos=body.ignore_eos, logprobs=logprobs)


def single_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequestError(f"prompt must be a string or a list of one string, got a list of {len(prompt)}",
                                      param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    return prompt
