"""One error family for the whole package.

Every failure a user can cause or meet carries a stable ``code`` (the string clients and
runbooks match on), an HTTP status (so the server maps it without a lookup table), and a
message that says what to do next. The CLI prints ``message`` on one line and exits non-zero;
the server wraps it in OpenAI's error envelope.
"""

from __future__ import annotations


class AiengError(Exception):
    """Base class: a failure with a stable code, an HTTP status and an actionable message."""

    code: str = "internal_error"
    status: int = 500
    type: str = "server_error"

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


class ModelNotFoundError(AiengError):
    """A model name or version that the store (or this server) does not have."""

    code = "model_not_found"
    status = 404
    type = "invalid_request_error"


class StoreError(AiengError):
    """A store operation that was refused; the store is left exactly as it was."""

    code = "store_error"
    status = 400
    type = "invalid_request_error"


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


class NotReadyError(AiengError):
    """The server is loading, warming up or draining."""

    code = "not_ready"
    status = 503
    type = "server_error"


class ConfigError(AiengError):
    """A setting (environment variable or flag) with an invalid value."""

    code = "invalid_setting"
    status = 400
    type = "invalid_request_error"
