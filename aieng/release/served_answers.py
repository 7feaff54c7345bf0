"""Answers a version gave while it was served, kept with it so a later version can be held to them.

A suite without assertions (a model with no labels) can only be judged by agreement with the
stable version. The canary's shadow probe has both versions served side by side; the watchdog
runs after a swap, when the replaced version is no longer served and its answers cannot be
asked for. So every time a version's probe answers are seen live, they are written into its
manifest (``served_answers``, a mutable field like ``eval``): by the canary's shadow probe for
both versions, by the watchdog for the version it watches, and by ``aieng release
record-answers`` (the deploy runbook runs it before its swap). The watchdog then compares the new
version's live answers with what the version it replaced answered to the same requests.

Answers are keyed by the request (messages or prompt and sampling settings), not by the case id:
the next release may bring an edited suite, and a case whose request is unchanged still matches.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from aieng.evaluation.answers import Answer
from aieng.evaluation.compare import comparison_metrics
from aieng.evaluation.suite_file import Case, Suite
from aieng.release.probe import ProbeResult, quality_probe
from aieng.store import ModelRef, ModelStore

MAX_KEPT = 2000  # answers kept per version; the oldest go first (a probe sample is tens of cases)


def request_key(case: Case) -> str:
    """A stable name for what the case asks the server: same request, same key."""
    request = {"messages": case.messages, "prompt": case.prompt, "sampling": case.sampling}
    return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


def record(store: ModelStore, name: str, version: str, probe: ProbeResult, *, by: str, url: str) -> int:
    """Merge ``probe``'s answers into ``name@version``'s manifest; returns how many it now keeps."""
    ref = ModelRef(name, version)
    kept = dict((store.manifest(ref).served_answers or {}).get("answers", {}))
    for case, answer in zip(probe.cases, probe.answers):
        key = request_key(case)
        kept.pop(key, None)  # re-inserted last: the newest answer is the one kept
        kept[key] = {"id": case.id, "text": answer.text, "tokens": answer.tokens}
    kept = dict(list(kept.items())[-MAX_KEPT:])
    when = datetime.now(UTC).isoformat(timespec="seconds")
    store.update_manifest(ref, served_answers={"answers": kept, "recorded_at": when, "by": by, "url": url})
    return len(kept)


def recorded(store: ModelStore, name: str, version: str, cases: list[Case]) -> tuple[list[Answer] | None, int]:
    """``version``'s recorded answers to ``cases`` in their order, or None with how many are missing."""
    kept = (store.manifest(ModelRef(name, version)).served_answers or {}).get("answers", {})
    found = [kept.get(request_key(case)) for case in cases]
    missing = sum(entry is None for entry in found)
    if missing:
        return None, missing
    return [Answer(entry["text"], int(entry["tokens"])) for entry in found], 0


def ask_and_record(
    store: ModelStore, name: str, url: str, *, version: str | None = None, suite: Suite | None = None, by: str
) -> tuple[int, str]:
    """Ask the server for ``name@version`` (default: current) the probe sample of ``suite`` (default:
    that version's own) and record the answers. Returns (answers kept, the version asked)."""
    version = version or store.current(name)
    if version is None:
        raise ValueError(f"{name} has no current version to ask")
    suite = suite or store.suite(ModelRef(name, version))
    if suite is None:
        raise ValueError(f"{name}@{version} has no eval suite registered; pass the suite whose probe to ask")
    return record(store, name, version, quality_probe(url, f"{name}@{version}", suite), by=by, url=url), version


def agreement_with_recorded(
    store: ModelStore, name: str, stable: str, live: ProbeResult, min_agreement: float
) -> tuple[str, list[str] | None]:
    """(what was seen, failures) of ``live`` against ``stable``'s recorded answers to the same
    requests; failures is None when stable's answers were never recorded for them (nothing judged)."""
    reference, missing = recorded(store, name, stable, live.cases)
    if reference is None:
        return (
            f"{missing} of {len(live.cases)} probe requests have no answer of {name}@{stable} on record "
            f"(record them while it is served: aieng release record-answers {name} --url URL)",
            None,
        )
    metrics, changed = comparison_metrics(live.cases, reference, live.answers)  # the comparison gate's
    seen = f"{metrics['agreement']:.0%} of {len(live.cases)} answers agree with {name}@{stable}'s served answers"
    if metrics["agreement"] < min_agreement - 1e-9:
        ids = ", ".join(c["id"] for c in changed[:5])
        return seen, [f"answers agree with {stable} on {metrics['agreement']:.0%} < {min_agreement:.0%} ({ids})"]
    return seen, []
