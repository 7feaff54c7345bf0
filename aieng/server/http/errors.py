"""Every error leaves the server as OpenAI's envelope; no traceback ever reaches a client."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aieng.errors import AiengError, InvalidRequestError
from aieng.observability import metrics

log = logging.getLogger("aieng.server")


def error_response(exc: AiengError, headers: dict | None = None) -> JSONResponse:
    """The envelope, counted in aieng_request_errors_total{code} (every error leaves through here)."""
    metrics.count_error(exc.code)
    return JSONResponse(exc.envelope(), status_code=exc.status, headers=headers)


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict", "literal"}


def _field_path(loc) -> list[str]:
    """The field's path without pydantic's union-branch tags (``function-after[...]``, ``str``, ``list[str]``)."""
    return [
        str(part)
        for part in loc
        if part != "body" and not (isinstance(part, str) and ("[" in part or "(" in part or part.lower() in _TYPE_TAGS))
    ]


def _describe_validation(exc: RequestValidationError) -> InvalidRequestError:
    errors = exc.errors() or [{"loc": (), "msg": "invalid request"}]
    # A union's branches each report an error: our own checks (value_error) say the most, then the
    # branch that got deepest into the value (a content part's bad "type", not "should be a string").
    first = max(errors, key=lambda e: (e.get("type") == "value_error", len(_field_path(e.get("loc", ())))))
    field = ".".join(_field_path(first.get("loc", ()))) or None
    kind = first.get("type", "")
    if kind == "value_error":
        first = {**first, "msg": str(first.get("msg", "")).removeprefix("Value error, ")}
    if kind == "missing":
        message = f"missing required field {field!r}"
    elif kind == "json_invalid":
        message = "request body is not valid JSON"
        field = None
    elif field is None:
        message = f"request body is invalid: {first.get('msg')}"
    else:
        message = f"invalid value for {field!r}: {first.get('msg')}"
    return InvalidRequestError(message, param=field)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AiengError)
    async def _aieng(_: Request, exc: AiengError):
        if exc.status >= 500:
            log.error("request failed: %s", exc.message, extra={"event": "request_error", "error_code": exc.code})
        retry_after = getattr(exc, "retry_after", None)
        return error_response(exc, headers={"Retry-After": str(retry_after)} if retry_after else None)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return error_response(_describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        err = AiengError(str(exc.detail), code="not_found" if exc.status_code == 404 else "http_error")
        err.status, err.type = exc.status_code, "invalid_request_error"
        return error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unhandled error", extra={"event": "unhandled_error"})  # traceback stays in the server log
        return error_response(AiengError("internal server error; the server log has the details"))
