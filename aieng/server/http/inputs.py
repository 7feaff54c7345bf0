"""From a parsed request body to a validated ``GenerationRequest``, off the event loop.

Tokenizing (and rendering the chat template) is model-side work that would stall every stream
on the event loop, so each request's preparation runs in one worker thread
(``asyncio.to_thread``): render or tokenize, then ``validate_request``, the single validation a
request passes before it is queued.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace

from aieng.engine import GenerationRequest, SamplingParams, validate_request
from aieng.engine.chat import chat_ids
from aieng.engine.constraints import Constraint
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
        self.constraints = engine.constraints  # grammars, compiled once per constraint
        # n choices take n rows: never more than the batch holds, and not the rows held now: a hot
        # swap's new engine starts with none of the KV memory and grows into what it planned.
        self.max_rows = max(engine.max_rows, engine.planned_rows)
        self.vocab_size = engine.model.config.vocab_size

    async def completion(self, body: CompletionRequest) -> GenerationRequest:
        prompt = single_prompt(body.prompt)
        scoring = body.logprobs if body.echo else None  # echo + logprobs: the prompt's logprobs too

        def build() -> GenerationRequest:
            return self._request(
                self.encode(prompt), body, body.max_tokens, logprobs=body.logprobs, prompt_logprobs=scoring
            )

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

    def _request(
        self, ids: list[int], body, max_tokens: int, *, logprobs: int | None, prompt_logprobs: int | None = None
    ) -> GenerationRequest:
        params = replace(sampling_params(body, max_tokens, logprobs), prompt_logprobs=prompt_logprobs)
        validate_request(len(ids), params, self.context_length)
        unknown = [token for token, _ in params.logit_bias if token >= self.vocab_size]
        if unknown:
            raise InvalidRequestError(
                f"logit_bias names token ids this model does not have: {unknown[:5]} (its "
                f"vocabulary has {self.vocab_size})",
                param="logit_bias",
            )
        if params.n > self.max_rows:
            raise InvalidRequestError(
                f"n must be at most {self.max_rows} here: each choice is a row of the batch "
                f"and this server runs {self.max_rows}",
                param="n",
            )
        matcher = (
            self.constraints.matcher(params.constraint) if params.constraint else None
        )  # compiled here, not on the engine thread
        context = tracing.current.get()
        return GenerationRequest(
            uuid.uuid4().hex, ids, params, trace_id=context.trace_id if context else None, matcher=matcher
        )


def sampling_params(body, max_tokens: int, logprobs: int | None = None) -> SamplingParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed,
        stop=stop,
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        constraint=constraint_of(body),
        n=body.n,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=logit_bias(body.logit_bias),
    )


def logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as (id, bias) pairs; a key that is not a token id is a 400."""
    pairs = []
    for key, value in (bias or {}).items():
        if not key.isdigit():
            raise InvalidRequestError(f"logit_bias keys are token ids, got {key!r}", param="logit_bias")
        pairs.append((int(key), value))
    return tuple(pairs)


def constraint_of(body) -> Constraint | None:
    """The one output constraint a request asks for: OpenAI's ``response_format``, or vLLM's
    ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``structured_outputs``."""
    found: list[Constraint] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(Constraint("json_object"))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise InvalidRequestError(
                "response_format of type json_schema needs json_schema: {name, schema}",
                param="response_format.json_schema",
            )
        found.append(Constraint.json_schema(fmt.json_schema.schema_, "response_format.json_schema.schema"))
    sources = [("guided_", body.guided_json, body.guided_regex, body.guided_choice)]
    if (outputs := body.structured_outputs) is not None:
        sources.append(("structured_outputs.", outputs.json_, outputs.regex, outputs.choice))
    for prefix, schema, regex, choice in sources:
        if schema is not None:
            found.append(Constraint.json_schema(_schema(schema, prefix + "json"), prefix + "json"))
        if regex is not None:
            found.append(Constraint("regex", regex, prefix + "regex"))
        if choice is not None:
            found.append(Constraint.choice(choice, prefix + "choice"))
    if len(found) > 1:
        raise InvalidRequestError(
            f"at most one output constraint per request, got {len(found)}: " + ", ".join(c.param for c in found),
            param=found[1].param,
        )
    return found[0] if found else None


def _schema(schema, param: str):
    if not isinstance(schema, str):
        return schema
    try:
        return json.loads(schema)
    except ValueError:
        raise InvalidRequestError("the JSON schema string is not valid JSON", param=param) from None


def single_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequestError(
                f"prompt must be a string or a list of one string, got a list of {len(prompt)}", param="prompt"
            )
        prompt = prompt[0]
    if not prompt:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    return prompt
