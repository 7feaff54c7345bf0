"""The one log line per request: route, timings, tokens, and how it ended.

Queue, prefill and decode times come from the scheduler's ``RequestStats`` (their only owner);
the total is measured here, from submission to the end of the response. With payload sampling
on (``AIENG_LOG_PAYLOAD_SAMPLE``) a share of lines also carries the prompt and the output.
"""

from __future__ import annotations

import logging
import random
import time

from aieng.observability.logs import log_event
from aieng.server.http.bridge import Submission

log = logging.getLogger("aieng.request")


def log_finished(
    submission: Submission, *, route: str, prompt=None, payload_sample: float = 0.0, served_by: dict | None = None
) -> None:
    """``served_by``: the version (and chat template version) that served it; during a hot swap
    two versions are live, so the process-wide service fields cannot say which one it was."""
    final = submission.final
    fields = {
        "route": route,
        "priority": submission.queued.priority,
        **(served_by or {}),
        "prompt_tokens": len(submission.request.prompt_ids),
        "total_s": round(time.perf_counter() - submission.submitted, 4),
        **submission.queued.stats.log_fields(),
    }
    if final is None:
        fields["outcome"] = "client_disconnected"
    elif final.error is not None:
        fields.update(outcome="error", error_code=final.error.code)
    else:
        fields.update(
            outcome="finished",
            finish_reason=final.finish_reason,
            finish_cause=final.finish_cause,
            completion_tokens=final.completion_tokens,
        )
    if payload_sample and random.random() < payload_sample:
        fields.update(prompt=prompt, output="".join(submission.text_parts))
    level = logging.WARNING if final is None or final.error is not None else logging.INFO
    log_event(log, "request_finished", level=level, **fields)
