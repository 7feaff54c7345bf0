"""Request and response bodies in OpenAI's shapes, so the official clients work unchanged.

Unknown fields are ignored (``extra="ignore"``), as OpenAI's server does. Types are strict, as
OpenAI's are: ``"stream": "yes"`` or ``"max_tokens": "16"`` is a 400 naming the field (from
``aieng.server.http.errors``), never coerced; an integer where a number is expected is fine. Text
must be encodable: JSON can carry a lone UTF-16 surrogate (``"\\ud800"``) that no tokenizer can
encode, so it is refused here. aieng's own extensions are marked.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from aieng.engine.params import MAX_TOP_LOGPROBS


def _encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text is not valid Unicode: a lone surrogate {text[exc.start : exc.end]!r} at character {exc.start}"
        ) from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str = "schema"
    schema_: dict | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # the output always follows the schema here, strict or not


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text`` (free), ``json_object`` (any JSON object) or
    ``json_schema`` (``{"json_schema": {"name", "schema", "strict"}}``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs``: exactly one of ``json``, ``regex``, ``choice``."""

    model_config = ConfigDict(extra="ignore", strict=True)

    json_: dict | bool | str | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: Text
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # extension (vLLM/TGI have it too)
    repetition_penalty: float = 1.0  # extension
    seed: int | None = None
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: dict | None = None  # {"include_usage": true} adds a final usage chunk
    n: int = 1  # choices, sharing the prompt's prefill (at most MAX_CHOICES, and the server's batch)
    priority: Literal["interactive", "batch"] = "interactive"  # extension: scheduling class
    timeout: float | None = Field(default=None, gt=0)  # extension: seconds until the request is abandoned
    ignore_eos: bool = False  # extension (as in vLLM): generate exactly max_tokens, for benchmarks
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's way) -> bias in [-100, 100]
    response_format: ResponseFormat | None = None
    # Extensions, as vLLM names them: the output must match a regex, be one of the choices, or
    # follow a JSON schema (structured_outputs is vLLM's newer form of the three).
    guided_regex: Text | None = None
    guided_choice: list[Text] | None = None
    guided_json: dict | bool | str | None = None
    structured_outputs: StructuredOutputs | None = None
    # Extension, as vLLM names it: the prompt's and each choice's token ids beside the text, so a
    # client can check the text against its own tokenizer (RL pipelines need the exact ids).
    return_token_ids: bool = False


class CompletionRequest(_Request):
    prompt: Text | list[Text]
    max_tokens: int = 16
    echo: bool = False  # the prompt's text before the completion's
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # OpenAI: <= 5; vLLM: 20


class ContentPart(BaseModel):
    """One part of a message's content. The served models take text: another type is a 400."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant"]  # developer: OpenAI's newer name for system
    content: Text | list[ContentPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    def template_role(self) -> str:
        return "system" if self.role == "developer" else self.role


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # needs logprobs: true


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens read from the prefix cache, not prefilled (AIENG_PREFIX_CACHE)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict | None = None  # tokens, token_logprobs, top_logprobs, text_offset (logprobs.py)
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict | None = None  # {"content": [...]} (logprobs.py)
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "aieng"
    version: str | None = None
    template_version: int | None = None  # the chat template's version (manifest.prompt_template)
    template_sha256: str | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]
