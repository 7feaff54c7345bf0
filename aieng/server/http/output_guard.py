"""The output guard: checks on what the model wrote, before (or as) it leaves, with a fallback reply.

Constrained decoding (``engine/constraints.py``) makes a requested format impossible to break;
the guard is for everything else, the application layer's last look at an answer:

- ``empty``: nothing but whitespace came out;
- ``repetition``: the answer ends in one piece of text repeated ``max_repeats`` times or more
  (``kimkimkimkim``, the same line over and over: a model stuck in a loop);
- ``json``: the prompt's task demands JSON (its text matches ``json_prompts``, a regex the
  deployment sets) and the answer does not parse;
- ``blocklist``: a word or phrase of the deployment's list (one per line, case-insensitive,
  whole words) appears;
- ``hook``: the deployment's own function, ``module:function`` called with ``(prompt, text)``,
  returns a reason (a string) to refuse the answer, or None.

Each check that fires is counted (``aieng_output_guard_total{check,action}``) and logged with the
trace id. What happens then is the deployment's ``action``: ``flag`` passes the answer on and marks
it (the ``X-Output-Guard`` header and a ``guard`` field on the choice), ``fallback`` replaces it
with the fallback reply and ``finish_reason: "content_filter"`` (OpenAI's value for an answer
withheld), and marks it the same way. ``flag`` is the default: a check that misfires then never
changes a valid answer.

A stream's text has left before the end: there the blocklist and the hook are checked on the
text so far as it grows (a hit ends the stream with ``content_filter``, with ``fallback``), and
the end-of-answer checks can only flag, in the last chunk.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from aieng.observability import metrics
from aieng.user_hooks import load_hook

log = logging.getLogger("aieng.server")

CHECKS = ("empty", "repetition", "json", "blocklist", "hook")
FORMAT_CHECKS = ("empty", "repetition", "json")
MAX_REPEATED_UNIT = 32  # characters in the repeating piece, at most
MIN_REPEATED_CHARS = 24  # "----------" under a heading is not a loop; 24 characters of one piece over and over is
ACTIONS = ("flag", "fallback")


@dataclass(frozen=True)
class Verdict:
    check: str
    reason: str
    action: str

    def field(self) -> dict:
        return {"check": self.check, "action": self.action, "reason": self.reason}


class OutputGuard:
    def __init__(
        self,
        *,
        checks: tuple[str, ...] = ("empty", "repetition"),
        action: str = "flag",
        max_repeats: int = 8,
        json_prompts: str = "",
        blocklist: tuple[str, ...] = (),
        hook=None,
        fallback: str = "",
    ):
        unknown = set(checks) - set(CHECKS)
        if unknown or action not in ACTIONS:
            raise ValueError(
                f"output guard: unknown check(s) {sorted(unknown)} or action {action!r}; "
                f"checks are {', '.join(CHECKS)}, actions {', '.join(ACTIONS)}"
            )
        self.checks, self.action, self.fallback = checks, action, fallback
        self.partial_checks = tuple(c for c in ("blocklist", "hook") if c in checks)  # judged as a stream grows
        self.max_repeats = max_repeats
        self.json_prompts = re.compile(json_prompts) if json_prompts else None
        words = [re.escape(w.strip()) for w in blocklist if w.strip()]
        self.blocked = re.compile(r"\b(?:" + "|".join(words) + r")\b", re.IGNORECASE) if words else None
        self.hook = hook

    @classmethod
    def from_settings(cls, settings) -> OutputGuard | None:
        """The deployment's guard (``AIENG_GUARD_*``), or None when no check is on."""
        checks = tuple(c.strip() for c in settings.guard_checks.split(",") if c.strip())
        if not checks:
            return None
        blocklist = ()
        if "blocklist" in checks:
            if not settings.guard_blocklist:
                raise ValueError(
                    "output guard: the blocklist check needs AIENG_GUARD_BLOCKLIST (a file, one entry per line)"
                )
            blocklist = tuple(Path(settings.guard_blocklist).read_text(encoding="utf-8").splitlines())
        hook = None
        if "hook" in checks:
            if not settings.guard_hook:
                raise ValueError("output guard: the hook check needs AIENG_GUARD_HOOK=module:function")
            hook = load_hook(settings.guard_hook, named_by="AIENG_GUARD_HOOK")
        if "json" in checks and not settings.guard_json_prompts:
            raise ValueError("output guard: the json check needs AIENG_GUARD_JSON_PROMPTS (a regex on the prompt)")
        return cls(
            checks=checks,
            action=settings.guard_action,
            max_repeats=settings.guard_max_repeats,
            json_prompts=settings.guard_json_prompts,
            blocklist=blocklist,
            hook=hook,
            fallback=settings.guard_fallback,
        )

    def check(self, prompt: str, text: str, *, constrained: bool = False) -> Verdict | None:
        """The whole answer: the first check that fires, or None. A constrained answer's format is
        the grammar's business (and an ``ignore_eos`` one has none): only the blocklist and the
        hook look at those."""
        for check in self.checks:
            if constrained and check in FORMAT_CHECKS:
                continue
            reason = getattr(self, f"_{check}")(prompt, text)
            if reason:
                return Verdict(check, reason, self.action)
        return None

    def check_partial(self, prompt: str, text: str) -> Verdict | None:
        """A stream's text so far: only what more text cannot undo (the blocklist, the hook)."""
        for check in self.partial_checks:
            reason = getattr(self, f"_{check}")(prompt, text)
            if reason:
                return Verdict(check, reason, self.action)
        return None

    def _empty(self, prompt: str, text: str) -> str | None:
        return "the answer is empty" if not text.strip() else None

    def _repetition(self, prompt: str, text: str) -> str | None:
        if self.max_repeats < 2:
            return None
        tail = text.rstrip()
        for size in range(1, MAX_REPEATED_UNIT + 1):  # 32 slice comparisons at most: cheap on the event loop
            unit = tail[-size:]
            need = max(self.max_repeats, -(-MIN_REPEATED_CHARS // size))
            if len(tail) < size * need or tail[-size * need :] != unit * need:
                continue
            count, start = need, len(tail) - size * need
            while start >= size and tail[start - size : start] == unit and count < 1000:  # counted up to 1,000
                count, start = count + 1, start - size
            return f"the answer ends in {unit!r} repeated {count}{'+' if count == 1000 else ''} times"
        return None

    def _json(self, prompt: str, text: str) -> str | None:
        if self.json_prompts is None or not self.json_prompts.search(prompt):
            return None
        try:
            json.loads(text)
        except ValueError as exc:
            return f"the prompt asks for JSON and the answer does not parse: {exc}"
        return None

    def _blocklist(self, prompt: str, text: str) -> str | None:
        found = self.blocked.search(text) if self.blocked else None
        return f"the answer contains a blocked term ({found.group(0)!r})" if found else None

    def _hook(self, prompt: str, text: str) -> str | None:
        reason = self.hook(prompt, text) if self.hook else None
        return str(reason) if reason else None


def record(verdict: Verdict, *, trace_id: str | None) -> None:
    """Count and log a verdict (the answer's text is never logged here: it may be what was blocked)."""
    metrics.OUTPUT_GUARD.labels(check=verdict.check, action=verdict.action).inc()
    log.warning(
        "output guard: %s (%s)",
        verdict.reason,
        verdict.action,
        extra={"event": "output_guard", "check": verdict.check, "action": verdict.action, "trace_id": trace_id},
    )
