"""The FastAPI application: routes only. Model work happens off the event loop."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from aieng.engine import SamplingParams
from aieng.errors import InvalidRequestError, ModelNotFoundError, NotReadyError
from aieng.server.errors import install_error_handlers
from aieng.server.middleware import BodySizeLimitMiddleware, RequestContextMiddleware
from aieng.server.schemas import (CompletionChoice, CompletionRequest, CompletionResponse, ModelCard, ModelList,
                                  Usage)


@dataclass
class ServerState:
    """What the routes need: the generator, what is served, and whether we are ready."""

    generator: object  # has .generate(prompt, SamplingParams) and .count_tokens(prompt)
    model_name: str
    model_version: str | None
    created: int = field(default_factory=lambda: int(time.time()))
    ready: bool = False

    def accepts(self, requested: str) -> bool:
        return requested in (self.model_name, f"{self.model_name}@{self.model_version}")


def create_app(state: ServerState, *, max_body_bytes: int = 1_000_000) -> FastAPI:
    app = FastAPI(title="aieng", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.aieng = state
    install_error_handlers(app)

    @app.get("/health/live")
    async def live():
        return {"status": "alive"}

    @app.get("/health/ready")
    async def ready():
        if not state.ready:
            return JSONResponse(NotReadyError("model is loading or warming up").envelope(), status_code=503)
        return {"status": "ready", "model": state.model_name, "version": state.model_version}

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=state.model_name, created=state.created, version=state.model_version)])

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> CompletionResponse:
        if not state.ready:
            raise NotReadyError("model is loading or warming up; retry when /health/ready returns 200")
        if not state.accepts(body.model):
            raise ModelNotFoundError(f"model {body.model!r} is not served here; this server serves {state.model_name!r}",
                                     param="model")
        prompt = _single_prompt(body.prompt)
        if body.stream:
            raise InvalidRequestError("stream=true is not supported by this server yet", param="stream")
        if body.n != 1:
            raise InvalidRequestError(f"n must be 1, got {body.n}", param="n")
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        params = SamplingParams(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                                top_k=body.top_k, repetition_penalty=body.repetition_penalty, seed=body.seed,
                                stop=stop).validate()
        result = await asyncio.to_thread(state.generator.generate, prompt, params)
        return CompletionResponse(
            id=f"cmpl-{request.scope['state']['request_id']}",
            created=int(time.time()),
            model=state.model_name,
            choices=[CompletionChoice(index=0, text=result.text, finish_reason=result.finish_reason)],
            usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                        total_tokens=result.prompt_tokens + result.completion_tokens),
        )

    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(RequestContextMiddleware)
    return app


def _single_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequestError(f"prompt must be a string or a list of one string, got a list of {len(prompt)}",
                                      param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    return prompt
