"""The FastAPI application: routes only.

A generation request goes: body parsed and checked (pydantic, ``schemas``) → prompt rendered,
tokenized and validated off the event loop (``inputs``) → queued with the scheduler and read back
token by token (``bridge``) → an OpenAI-shaped response, whole or as server-sent events (``sse``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from aieng.errors import ModelNotFoundError, NotReadyError
from aieng.observability.metrics import serving_version, update_resource_gauges
from aieng.observability.prom import metrics_text
from aieng.server.http.admin import install_admin_routes
from aieng.server.http.capture import Capture
from aieng.server.http.disconnect import unless_disconnected
from aieng.server.http.errors import install_error_handlers
from aieng.server.http.inputs import single_prompt
from aieng.server.http.middleware import BodySizeLimitMiddleware, RequestContextMiddleware
from aieng.server.http.output_guard import OutputGuard
from aieng.server.http.replies import ReplyOptions, reply_choices
from aieng.server.http.request_log import log_finished
from aieng.server.http.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Usage,
)
from aieng.server.http.sse import stream_chunks
from aieng.server.process.canary_serving import pick

CLIENT_CLOSED_REQUEST = 499  # nginx's code for "the client went away"; nobody reads the body


def create_app(
    runtime, *, max_body_bytes: int = 1_000_000, body_timeout_s: float = 0.0, start_runtime: bool = True
) -> FastAPI:
    """``runtime``: the process's ``aieng.server.process.runtime.Runtime`` (model, scheduler, readiness)."""
    capture = Capture.from_settings(runtime.settings)  # None: capture off (the default)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if start_runtime:
            await asyncio.to_thread(runtime.start)
        update_resource_gauges()  # the summed RSS counts this worker before its first request or scrape
        yield
        runtime.stop()
        if capture is not None:
            capture.close()  # what is queued is written

    app = FastAPI(title="aieng", version="0.1.0", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.runtime = runtime
    app.state.guard = OutputGuard.from_settings(runtime.settings)  # None: no check on
    app.state.capture = capture
    install_error_handlers(app)

    @app.get("/health/live")
    async def live():
        return {"status": "alive"}  # the process answers; never depends on the model

    @app.get("/health")  # what vLLM and TGI answer, and what load-test tools (GuideLLM) probe first
    @app.get("/health/ready")
    async def ready():
        # 503 while starting: the not_ready envelope plus the start-up phase, its detail and seconds
        status, body = runtime.readiness()
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models")
    async def models() -> ModelList:
        template = runtime.serving.template if runtime.serving is not None else {}
        return ModelList(
            data=[
                ModelCard(
                    id=runtime.model_name,
                    created=int(runtime.started_at),
                    version=runtime.model_version,
                    template_version=template.get("version"),
                    template_sha256=template.get("sha256"),
                )
            ]
        )

    @app.get("/metrics")
    def metrics():  # a plain def: FastAPI runs it on a thread, so reading every process's metric
        # files never holds the event loop and the streams it is serving (the GIL switches every 5 ms)
        update_resource_gauges()
        body, content_type = metrics_text()
        return Response(body, media_type=content_type)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        seen = capture.begin(request.url.path, body, request.state.trace.trace_id) if capture else None
        try:
            await runtime.wait_ready()
            _check_common(runtime, body)
            serving, submission = await _submit(runtime, body, lambda s: s.inputs.completion(body), request)
            return await _respond(
                runtime, serving, submission, request, body, chat=False, prompt=body.prompt, seen=seen
            )
        except Exception as exc:
            if seen is not None:  # a 5xx before or instead of a reply is kept (a finished one was already)
                seen.failed(exc)
            raise

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        seen = capture.begin(request.url.path, body, request.state.trace.trace_id) if capture else None
        try:
            await runtime.wait_ready()
            _check_common(runtime, body)
            serving, submission = await _submit(runtime, body, lambda s: s.inputs.chat(body), request)
            prompt = [m.model_dump() for m in body.messages]
            return await _respond(runtime, serving, submission, request, body, chat=True, prompt=prompt, seen=seen)
        except Exception as exc:
            if seen is not None:
                seen.failed(exc)
            raise

    if runtime.settings.admin_token:  # no token, no admin routes: they answer 404 like any unknown path
        install_admin_routes(app, runtime)

    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes, timeout_s=body_timeout_s)
    app.add_middleware(
        RequestContextMiddleware, metrics_enabled=runtime.settings.metrics, model_version=lambda: runtime.model_version
    )
    return app


async def _submit(runtime, body, build, request: Request):
    """Render and tokenize with one serving version and queue with the same one.

    A hot swap may retire the version between the two (its scheduler then refuses new work):
    the request is rebuilt once on the version that replaced it, so a swap fails no request."""
    key = request.headers.get("x-session-id") or request.state.trace.request_id  # sticky per session
    serving = pick(runtime, body.model, key)  # stable, or the canary (canary.py)
    serving_version.set(serving.version)  # errors from here on are this version's
    try:
        return serving, serving.bridge.submit(await build(serving), priority=body.priority, timeout=body.timeout)
    except NotReadyError:
        if serving is runtime.serving or serving is runtime.canary or runtime.admission_closed:
            raise
    serving = pick(runtime, body.model, key)  # the version that replaced it
    serving_version.set(serving.version)
    return serving, serving.bridge.submit(await build(serving), priority=body.priority, timeout=body.timeout)


def _check_common(runtime, body) -> None:
    runtime.require_ready()
    if body.model.split("@", 1)[0] != runtime.model_name:  # a version after @ is checked by canary.pick
        raise ModelNotFoundError(
            f"model {body.model!r} is not served here; this server serves {runtime.model_name!r}", param="model"
        )


def _guarded_text(body, *, chat: bool) -> str:
    """What the output guard reads as the prompt: a completion's prompt, a chat's last user message."""
    if not chat:
        return single_prompt(body.prompt)
    return next((m.text() for m in reversed(body.messages) if m.role == "user"), "")


async def _respond(runtime, serving, submission, request: Request, body, *, chat: bool, prompt, seen=None):
    """``seen``: the request's capture (``capture.RequestCapture``) when capture is on, told the outcome."""
    bridge = serving.bridge
    if seen is not None:
        seen.served_version = serving.version
    guard, trace_id = request.app.state.guard, request.state.trace.trace_id
    guard_prompt = _guarded_text(body, chat=chat) if guard is not None else ""
    # A constrained answer's format is its grammar's; one past EOS on purpose (ignore_eos, benchmarks) has none.
    constrained = submission.request.params.constraint is not None or submission.request.params.ignore_eos
    headers = {"X-Model-Version": serving.version}  # the version that serves this request, to its end
    served_by = {"model_version": serving.version, "template_version": serving.template.get("version")}
    route = request.url.path
    sample = runtime.settings.log_payload_sample
    response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    texts = serving.inputs.token_texts if submission.request.params.logprobs is not None else None
    echo = single_prompt(body.prompt) if not chat and body.echo else ""
    scored = submission.request.prompt_ids if submission.request.params.prompt_logprobs is not None else ()
    options = ReplyOptions(
        chat=chat,
        texts=texts,
        echo=echo,
        scored=scored,
        guard=guard,
        guard_prompt=guard_prompt,
        constrained=constrained,
        trace_id=trace_id,
        context_ids=submission.request.prompt_ids,
        prompt_ids=submission.request.prompt_ids if body.return_token_ids else None,
    )
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))

        async def chunks():
            try:
                async for chunk in stream_chunks(
                    bridge.events(submission),
                    options,
                    response_id=response_id,
                    created=created,
                    model=runtime.model_name,
                    include_usage=include_usage,
                    n=submission.request.params.n,
                ):
                    yield chunk
            except Exception as exc:
                if seen is not None:
                    seen.failed(exc)
                raise
            finally:
                log_finished(submission, route=route, prompt=prompt, payload_sample=sample, served_by=served_by)
                if seen is not None:
                    seen.finished(submission, options.verdict)

        return StreamingResponse(
            chunks(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
        )
    final = await unless_disconnected(bridge.result(submission), request.receive)
    log_finished(submission, route=route, prompt=prompt, payload_sample=sample, served_by=served_by)
    if seen is not None and (final is None or final.error is not None):
        seen.finished(submission)
    if final is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST, headers=headers)
    if final.error is not None:
        raise final.error
    usage = Usage(
        prompt_tokens=final.prompt_tokens,
        completion_tokens=final.completion_tokens,
        total_tokens=final.prompt_tokens + final.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=final.cached_tokens),
    )
    choices, verdict = reply_choices(submission, options)
    if seen is not None:
        seen.finished(submission, verdict)
    if verdict is not None:
        headers["X-Output-Guard"] = f"{verdict.check}; action={verdict.action}"
    kind = ChatCompletionResponse if chat else CompletionResponse
    content = kind(id=response_id, created=created, model=runtime.model_name, usage=usage, choices=[]).model_dump()
    content["choices"] = choices
    if chat and options.prompt_ids is not None:
        content["prompt_token_ids"] = list(options.prompt_ids)
    return JSONResponse(content, headers={**headers, "Server-Timing": submission.queued.stats.server_timing()})
