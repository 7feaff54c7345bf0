"""Request and response bodies in OpenAI's shapes, so the official clients work unchanged.

Unknown fields are ignored (``extra="ignore"``), as OpenAI's server does; wrong types are turned
into a 400 naming the field by ``aieng.server.errors``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str | list[str]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "aieng"
    version: str | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]
