"""One JSON object per line on stderr: ``ts``, ``level``, ``event``, ``trace_id``, ``request_id``,
``model``, ``version``, plus the fields of the event.

Call ``log_event(logger, "request_finished", **fields)``; plain ``logger.info("text")`` lines
become ``{"event": "log", "message": ...}``. Lines written on the event loop take the trace from
the context variable; the engine thread passes ``trace_id=`` explicitly.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback

from aieng.observability import tracing

_SERVICE: dict[str, str | None] = {"model": None, "version": None}
_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


def set_service(model: str | None, version: str | None) -> None:
    _SERVICE.update(model=model, version=version)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = tracing.current.get()
        fields = {k: v for k, v in vars(record).items() if k not in _RESERVED}
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": fields.pop("event", "log"),
            "trace_id": fields.pop("trace_id", None) or (context.trace_id if context else None),
            "request_id": fields.pop("request_id", None) or (context.request_id if context else None),
            "model": _SERVICE["model"],
            "version": _SERVICE["version"],
            "logger": record.name,
        }
        message = record.getMessage()
        if message and message != line["event"]:
            line["message"] = message
        line.update(fields)
        if record.exc_info:
            line["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        return json.dumps(line, default=str)


def configure_logging(level: str = "info") -> None:
    """Route every logger (aieng, uvicorn, gunicorn) through the JSON formatter on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "gunicorn", "gunicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True


def log_event(logger: logging.Logger, event: str, *, level: int = logging.INFO, **fields) -> None:
    logger.log(level, event, extra={"event": event, **fields})


try:
    from gunicorn.glogging import Logger as _GunicornLogger
except ImportError:  # gunicorn is only needed by `aieng serve`
    _GunicornLogger = object


class GunicornJsonLogger(_GunicornLogger):
    """gunicorn ``logger_class``: gunicorn's own lines in the same JSON shape as everything else."""

    def setup(self, cfg):
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            for handler in logger.handlers:
                handler.setFormatter(JsonFormatter())
