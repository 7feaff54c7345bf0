"""A user's own function named as ``module:function``: redaction (``AIENG_CAPTURE_REDACT``), the
output guard's hook (``AIENG_GUARD_HOOK``), a suite's custom assertion.

Loaded once, where it is named (server start, reading a suite), so a typo or a module that fails
on import is one clear error then, never a failure at serve time.
"""

from __future__ import annotations

import importlib

from aieng.errors import AiengError, ConfigError


def load_hook(spec: str, *, named_by: str, error: type[AiengError] = ConfigError):
    """``spec`` (``module:function``) to the callable; ``error`` naming ``named_by`` (the setting
    or the place that named it) when it is malformed, cannot be imported or is not callable."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise error(f"{named_by}={spec!r}: give module:function")
    try:
        hook = getattr(importlib.import_module(module), name)
    except Exception as exc:  # not found, or its module failed on import: either way, not at serve time
        raise error(
            f"{named_by}={spec!r} cannot be loaded ({type(exc).__name__}: {exc}); the module must be "
            "importable where aieng runs (installed, or on PYTHONPATH)"
        ) from None
    if not callable(hook):
        raise error(f"{named_by}={spec!r}: {name} is not callable")
    return hook
