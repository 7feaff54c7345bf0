"""Waiting on a condition in a test, instead of sleeping a fixed time: a busy machine makes the
test slower, not red."""

from __future__ import annotations

import time


def poll(check, timeout: float, poll_s: float = 0.02):
    """``check()``'s first truthy value, asked every ``poll_s`` until ``timeout`` has passed; its
    last (falsy) value when the condition never came, for the caller to assert on."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return value
