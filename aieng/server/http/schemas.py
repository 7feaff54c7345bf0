"""Request and response bodies in OpenAI's shapes, so the official clients work unchanged.

Unknown fields are ignored (``extra="ignore"``), as OpenAI's server does; wrong types are turned
into a 400 naming the field by ``aieng.server.http.errors``. aieng's own extensions are marked.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # extension (vLLM/TGI have it too)
    repetition_penalty: float = 1.0  # extension
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None  # {"include_usage": true} adds a final usage chunk
    n: int = 1
    priority: Literal["interactive", "batch"] = "interactive"  # extension: scheduling class
    timeout: float | None = Field(default=None, gt=0)  # extension: seconds until the request is abandoned
    ignore_eos: bool = False  # extension (as in vLLM): generate exactly max_tokens, for benchmarks


class CompletionRequest(_Request):
    prompt: str | list[str]
    max_tokens: int = 16
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str | list[dict]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
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
    logprobs: None = None
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
