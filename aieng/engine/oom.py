"""Out of memory: recognise it on any device, and bisect a batch until what is left fits.

A batch that does not fit is split in halves and each half retried; a single row that still does
not fit fails alone (``OutOfMemoryRowError``, 503) and the engine carries on. Prefill and decode
use the same ``bisect_on_oom``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from aieng.errors import AiengError

log = logging.getLogger("aieng.engine")

T = TypeVar("T")
R = TypeVar("R")


class OutOfMemoryRowError(AiengError):
    code = "out_of_memory"
    status = 503
    type = "server_error"
    request_path = True


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return "out of memory" in text or "can't allocate memory" in text or "failed to allocate" in text
    return False


def release_cached_memory(device: torch.device) -> None:
    """After a CUDA OOM, hand cached blocks back so the retry sees them."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bisect_on_oom(
    items: Sequence[T],
    attempt: Callable[[Sequence[T]], R],
    *,
    combine: Callable[[R, R], R],
    fail_one: Callable[[T, BaseException], R],
    device: torch.device,
    phase: str,
    on_split: Callable[[str], None] = lambda phase: None,
) -> R:
    """``attempt(items)``; on out-of-memory, the same on each half, ``combine``-d; one item alone: ``fail_one``.

    Any other exception propagates unchanged. ``phase`` ("prefill" or "decode") names the split
    in the log line; ``on_split(phase)`` is called once per out-of-memory caught (the runner counts them).
    """
    try:
        return attempt(items)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        release_cached_memory(device)
        on_split(phase)
        log.warning(
            "out of memory in a %s of %d rows; splitting",
            phase,
            len(items),
            extra={"event": "engine_oom_split", "phase": phase, "rows": len(items)},
        )
        if len(items) == 1:
            return fail_one(items[0], exc)
    half = len(items) // 2

    def again(part):
        return bisect_on_oom(
            part, attempt, combine=combine, fail_one=fail_one, device=device, phase=phase, on_split=on_split
        )

    return combine(again(items[:half]), again(items[half:]))


def degraded_event(row, exc: BaseException | None):
    """The degraded mode (``AIENG_OOM_DEGRADE=1``): a row that runs out of memory even alone,
    after it has generated something, ends as if its ``max_tokens`` had been reached, with
    ``finish_cause`` ``out_of_memory`` (counted in ``aieng_oom_degraded_total``). The trade-off:
    a client that does not check ``finish_reason`` takes a cut answer for a whole one; one that
    does can ask again. A prompt that does not fit alone still fails: no shorter answer helps it."""
    log.warning(
        "out of memory even alone in the batch after %d tokens: ending the request with them (degraded mode): %s",
        len(row.generated),
        exc,
        extra={
            "event": "engine_oom_degraded",
            "trace_id": row.request.trace_id,
            "completion_tokens": len(row.generated),
        },
    )
    return row.truncate("out_of_memory")


def out_of_memory_event(request, exc: BaseException | None, *, row=None, degrade: bool = False):
    """The final event of a request that ran out of memory alone in its batch (or found no free KV
    slot): a 503 ``out_of_memory`` error, or with ``degrade`` and tokens already generated, the
    degraded ending."""
    from aieng.engine.request import error_event

    if degrade and row is not None and row.generated:
        return degraded_event(row, exc)
    log.error(
        "out of memory even alone in the batch: %s",
        exc or "no free KV slot",
        extra={"event": "engine_oom", "trace_id": request.trace_id, "prompt_tokens": len(request.prompt_ids)},
    )
    return error_event(request.request_id, out_of_memory_error(), prompt_tokens=len(request.prompt_ids))


def out_of_memory_error() -> OutOfMemoryRowError:
    return OutOfMemoryRowError(
        "out of memory while generating for this request, even alone in its batch. "
        "Retry with a shorter prompt or fewer max_tokens"
    )
