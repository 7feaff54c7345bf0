"""One error family for the whole package.

Every failure a user can cause or meet carries a stable ``code`` (the string clients and
runbooks match on), an HTTP status (so the server maps it without a lookup table), and a
message that says what to do next. The CLI prints ``message`` on one line and exits non-zero;
the server wraps it in OpenAI's error envelope.

Classes whose errors can end an HTTP request say so with ``request_path = True`` (and list any
other ``code`` they are raised with in ``other_codes``): ``request_error_codes()`` collects them,
and the server pre-creates ``aieng_request_errors_total{code}`` at zero for each, so ``rate()``
and the alert rules work before the first error.
"""

from __future__ import annotations


class AiengError(Exception):
    """Base class: a failure with a stable code, an HTTP status and an actionable message."""

    code: str = "internal_error"
    status: int = 500
    type: str = "server_error"
    request_path: bool = True  # an unexpected failure answers any request as internal_error
    other_codes: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.request_path = cls.__dict__.get("request_path", False)  # each class opts in itself

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def envelope(self) -> dict:
        """The OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequestError(AiengError):
    """The client sent something we cannot serve (bad parameter, prompt too long)."""

    code = "invalid_parameter"
    status = 400
    type = "invalid_request_error"
    request_path = True
    other_codes = ("context_length_exceeded",)


class RequestTooLargeError(InvalidRequestError):
    """The request body is over the server's limit (refused before it is parsed)."""

    code = "request_too_large"
    status = 413
    request_path = True
    other_codes = ()


class ModelNotFoundError(AiengError):
    """A model name or version that the store (or this server) does not have."""

    code = "model_not_found"
    status = 404
    type = "invalid_request_error"
    request_path = True


class StoreError(AiengError):
    """A store operation that was refused; the store is left exactly as it was."""

    code = "store_error"
    status = 400
    type = "invalid_request_error"


class SuiteError(AiengError):
    """An eval suite file that cannot be used as it is (schema, a pattern, a hook, a file)."""

    code = "suite_invalid"
    status = 400
    type = "invalid_request_error"


class GateRefusedError(AiengError):
    """The release gate refused a candidate; ``decision`` says every rule that fired."""

    code = "release_gate_refused"
    status = 409

    def __init__(self, message: str, *, decision=None):
        super().__init__(message)
        self.decision = decision


class UnauthorizedError(AiengError):
    """An admin route without ``Authorization: Bearer <token>``."""

    code = "unauthorized"
    status = 401
    type = "authentication_error"


class ForbiddenError(AiengError):
    """An admin route with the wrong token."""

    code = "forbidden"
    status = 403
    type = "permission_error"


class ReloadError(AiengError):
    """A running server did not end on the version it was asked to serve (``--reload``)."""

    code = "reload_failed"
    status = 502


class VerificationError(AiengError):
    """Stored files do not match their manifest hashes: the version must not be loaded."""

    code = "verification_failed"
    status = 500

    def __init__(self, message: str, *, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


class ModelLoadError(AiengError):
    """The weights could not be loaded safely (remote code, memory budget, format)."""

    code = "model_load_failed"
    status = 500


class SlowClientError(AiengError):
    """The client took too long to send its request (headers or body): 408, connection closed."""

    code = "request_timeout"
    status = 408
    type = "invalid_request_error"
    request_path = True


class ConnectionLimitError(AiengError):
    """A worker is at ``AIENG_MAX_CONNECTIONS``: 503 before the request is read."""

    code = "too_many_connections"
    status = 503
    type = "server_error"
    request_path = True


class NotReadyError(AiengError):
    """The server is loading, warming up or draining."""

    code = "not_ready"
    status = 503
    type = "server_error"
    request_path = True
    other_codes = ("engine_stuck",)


class ConfigError(AiengError):
    """A setting (environment variable or flag) with an invalid value."""

    code = "invalid_setting"
    status = 400
    type = "invalid_request_error"


def request_error_codes() -> list[str]:
    """Every error code a request can end with, from the classes imported so far that opt in.

    The server calls it once every request-path module is imported (engine, scheduler, HTTP).
    """
    codes: set[str] = set()
    pending = [AiengError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.request_path:
            codes.add(cls.code)
            codes.update(cls.other_codes)
    return sorted(codes)
