"""Settings from ``AIENG_*`` environment variables, overridable by CLI flags.

A plain dataclass rather than a settings framework: the fields are few, the CLI passes
overrides explicitly, and the same object is handed down to every component that needs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


@dataclass(frozen=True)
class Settings:
    store: Path = field(default_factory=lambda: Path("var/store"))  # AIENG_STORE: the model store root
    model: str = "demo"  # AIENG_MODEL: N or N@V served by `aieng serve`
    host: str = "127.0.0.1"  # AIENG_HOST: loopback by default; set 0.0.0.0 behind a proxy deliberately
    port: int = 8000  # AIENG_PORT
    workers: str = "auto"  # AIENG_WORKERS: "auto" or a count
    torch_threads: int = 0  # AIENG_TORCH_THREADS: torch threads per worker; 0 = the worker plan decides
    device: str = "auto"  # AIENG_DEVICE: auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # AIENG_DTYPE: auto (fp32 on CPU, bf16 on CUDA when supported) | float32 | bfloat16 | float16
    gpu_memory_fraction: float = 0.9  # AIENG_GPU_MEMORY_FRACTION: share of GPU memory the weights may plan to use
    memory_headroom: float = 0.8  # AIENG_MEMORY_HEADROOM: share of available RAM the weights may plan to use
    max_body_bytes: int = 1_000_000  # AIENG_MAX_BODY_BYTES: request-body limit (413 beyond)
    log_level: str = "info"  # AIENG_LOG_LEVEL
    max_batch_size: int = 32  # AIENG_MAX_BATCH_SIZE: rows decoded together (1 = batching off)
    max_batch_tokens: int = 4096  # AIENG_MAX_BATCH_TOKENS: padded prompt tokens prefilled per step
    max_queue: int = 256  # AIENG_MAX_QUEUE: waiting requests before 429
    max_queue_delay_ms: float = 10.0  # AIENG_MAX_QUEUE_DELAY_MS: an idle engine waits this long to batch a burst
    request_timeout_s: float = 300.0  # AIENG_REQUEST_TIMEOUT_S: deadline of requests that set no `timeout`
    graceful_timeout_s: int = 30  # AIENG_GRACEFUL_TIMEOUT_S: in-flight requests' time to finish after SIGTERM
    drain_delay_s: float = 1.0  # AIENG_DRAIN_DELAY_S: readiness is 503 this long before the listener closes
    compile: bool = True  # AIENG_COMPILE: torch.compile prefill and decode during warm-up (0 = eager, fast start)
    int8: bool = False  # AIENG_INT8: dynamic int8 Linear layers (CPU)
    metrics: bool = True  # AIENG_METRICS: record Prometheus metrics (off only to measure their cost)
    log_payload_sample: float = 0.0  # AIENG_LOG_PAYLOAD_SAMPLE: share of requests whose prompt and output are logged

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        """Defaults, then ``AIENG_<FIELD>`` variables, then non-None ``overrides`` (CLI flags)."""
        values: dict = {}
        for f in fields(cls):
            raw = _env(f"AIENG_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _coerce(f.name, raw)
        settings = cls(**values)
        clean = {k: (_coerce(k, v) if isinstance(v, str) else v) for k, v in overrides.items() if v is not None}
        return replace(settings, **clean)


def _coerce(name: str, raw: str):
    kinds = {"store": Path, "port": int, "torch_threads": int, "gpu_memory_fraction": float, "memory_headroom": float, "max_body_bytes": int,
             "max_batch_size": int, "max_batch_tokens": int, "max_queue": int, "max_queue_delay_ms": float,
             "request_timeout_s": float, "graceful_timeout_s": int, "drain_delay_s": float,
             "compile": _flag, "int8": _flag, "metrics": _flag, "log_payload_sample": _rate}
    kind = kinds.get(name, str)
    try:
        return kind(raw)
    except ValueError as exc:
        from aieng.errors import ConfigError

        raise ConfigError(f"AIENG_{name.upper()}={raw!r} is not a valid {kind.__name__.strip('_')}") from exc


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _rate(raw: str) -> float:
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(raw)
    return value
