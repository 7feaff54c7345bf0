"""``aieng release watch``: after a swap, judge the live metrics and roll back unattended.

Every ``interval`` it scrapes the server's ``/metrics``, turns the increase since the watch began
into a ``decision.Window`` and applies ``decision.decide``: on ``rollback`` it rolls the store
back (the reason names the rule and its numbers), hot-swaps the server and stops; on
``promote`` it records that the version held for its window; on ``hold`` it keeps watching, up
to ``max_wait_s``. Every outcome is written to ``history.jsonl``.

Outside the server on purpose: a watchdog inside a worker would judge only that worker's
traffic and could die with it; this one reads the merged metrics of every worker, like
Prometheus does. The operator runs it after a release (``aieng release watch``); the deploy_model
runbook runs it for ``watch_window_s`` after its own hot swap, or prints the command when that
parameter is 0 (``aieng release canary`` judges its steps with ``canary_rollout`` instead).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aieng.observability.scrape import Snapshot, delta, scrape
from aieng.release.decision import HOLD, PROMOTE, ROLLBACK, Decision, RollbackThresholds, Window, decide
from aieng.release.probe import quality_probe, regressed
from aieng.release.served_answers import agreement_with_recorded
from aieng.release.served_answers import record as record_answers
from aieng.store import ModelRef, ModelStore

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")


def generation_requests(snapshot: Snapshot, version: str | None = None) -> tuple[float, float]:
    """Generation requests in ``snapshot`` (a scrape or a delta of two), and those answered with a
    5xx; with ``version``, only that version's."""
    requests = errors = 0.0
    for (name, labels), value in snapshot.samples.items():
        items = dict(labels)
        if (
            name != "aieng_requests_total"
            or items.get("route") not in GENERATION_ROUTES
            or (version is not None and items.get("version") != version)
        ):
            continue
        requests += value
        errors += value if items.get("code", "").startswith("5") else 0.0
    return requests, errors


def window_between(
    before: Snapshot,
    after: Snapshot,
    seconds: float,
    running: list[float],
    *,
    eval_regressed: bool = False,
    version: str | None = None,
) -> Window:
    """The server's work between two scrapes, as the decision reads it; with ``version``, only the
    requests that version served (the request metrics carry it), so what the old version finishes
    after a swap, or what a neighbour version serves, is not judged against this one."""
    d = delta(before, after)
    only = {} if version is None else {"version": version}
    requests, errors = generation_requests(d, version)
    finished = d.value("aieng_requests_finished_total", **only)

    def p99(histogram: str) -> float | None:
        value = d.quantile(histogram, 0.99, **only)
        return None if value != value else value  # NaN: nothing observed

    return Window(
        seconds=seconds,
        requests=int(requests),
        errors=int(errors),
        early_eos=int(d.value("aieng_eos_early_total", **only)),
        latency_p99_s=p99("aieng_request_duration_seconds") if finished else None,
        ttft_p99_s=p99("aieng_time_to_first_token_seconds") if finished else None,
        tokens_per_s=d.value("aieng_generation_tokens_total", **only) / seconds if seconds > 0 else None,
        mean_running=sum(running) / len(running) if running else 0.0,
        eval_regressed=eval_regressed,
    )


@dataclass
class WatchResult:
    decision: Decision
    version: str
    rolled_back_to: str | None = None
    checks: list[dict] = field(default_factory=list)  # one per interval: seconds, requests, action, rule


def watch(
    store: ModelStore,
    name: str,
    url: str,
    *,
    thresholds: RollbackThresholds = RollbackThresholds(),
    interval_s: float = 5.0,
    max_wait_s: float | None = None,
    reload: Callable[[str, str], object] | None = None,
    probe: bool = True,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchResult:
    """Watch ``name``'s current version on the server at ``url`` and act on the decision.

    ``probe``: first ask the server a sample of the version's suite (``probe.quality_probe``)
    and count it as an eval regression when a family falls well below the stable version's
    recorded eval, or, for a suite without assertions, when fewer than
    ``thresholds.min_probe_agreement`` of the answers equal the replaced version's served ones.
    ``reload(url, version)`` hot-swaps the server after a rollback
    (``release.reload.reload_server`` by default)."""
    if reload is None:
        from aieng.release.reload import reload_server as reload
    version = store.current(name)
    if version is None:
        raise ValueError(f"{name} has no current version to watch")
    baseline = _baseline(store, name, version)
    max_wait_s = max_wait_s if max_wait_s is not None else 3 * thresholds.window_s
    running: list[float] = []
    checks: list[dict] = []
    quality_drop: list[str] = []
    if probe:
        quality_drop = _probe(store, name, version, url, thresholds.min_probe_agreement, log)
    # The window opens after the probe: its own short, held-out answers are judged by the probe,
    # and counted with the users' traffic they would pass for an early-EOS storm.
    start, first = time.monotonic(), scrape(url)
    while True:
        sleep(interval_s)
        now = scrape(url)
        running.append(now.value("aieng_requests_running"))
        window = window_between(
            first, now, time.monotonic() - start, running, eval_regressed=bool(quality_drop), version=version
        )
        decision = decide(window, baseline, thresholds)
        checks.append(
            {
                "seconds": round(window.seconds, 1),
                "requests": window.requests,
                "errors": window.errors,
                "action": decision.action,
                "rule": decision.rule,
            }
        )
        log(
            f"[watch {name}@{version}] {window.seconds:5.0f} s  {window.requests:5d} requests  "
            f"{window.errors} errors  -> {decision.action} ({decision.rule}): {decision.reason}"
        )
        if decision.action == ROLLBACK:
            why = decision.reason + (f" ({'; '.join(quality_drop)})" if decision.rule == "eval_regression" else "")
            event = store.rollback(name, reason=f"watchdog: {decision.rule}: {why}", actor="aieng release watch")
            reload(url, event["to"])
            store.record_event(
                name,
                {
                    "action": "watch_rollback",
                    "from": version,
                    "to": event["to"],
                    "reason": decision.reason,
                    "actor": "aieng release watch",
                    "decision": decision.to_dict(),
                    "checks": checks,
                },
            )
            return WatchResult(decision, version, event["to"], checks)
        if decision.action == PROMOTE or window.seconds >= max_wait_s:
            store.record_event(
                name,
                {
                    "action": "watch_confirmed" if decision.action == PROMOTE else "watch_undecided",
                    "from": version,
                    "to": version,
                    "reason": decision.reason,
                    "actor": "aieng release watch",
                    "decision": decision.to_dict(),
                    "checks": checks,
                },
            )
            return WatchResult(
                decision if decision.action == PROMOTE else Decision(HOLD, decision.rule, decision.reason),
                version,
                None,
                checks,
            )


def _previous(store: ModelStore, name: str, version: str) -> str | None:
    """The version that ``version`` replaced, from history."""
    for event in reversed(store.history(name)):
        if event.get("action") in ("promote", "rollback") and event.get("to") == version and event.get("from"):
            return event["from"]
    return None


def _probe(store: ModelStore, name: str, version: str, url: str, min_agreement: float, log) -> list[str]:
    """The version's suite asked live (pinned to the version) and its answers recorded with it.

    A labelled suite is judged by its assertions against the stable version's recorded rates. A
    suite without assertions by agreement with what the replaced version answered to the same
    requests while it was served (``served_answers``: the canary's shadow probe or
    ``aieng release record-answers`` kept them); where none were kept, that is said, not skipped
    silently."""
    tag = f"[watch {name}@{version}]"
    suite = store.suite(ModelRef(name, version))
    if suite is None:
        log(f"{tag} no quality probe: no eval suite is registered with it; errors, latency and early EOS are watched")
        return []
    live = quality_probe(url, f"{name}@{version}", suite)
    record_answers(store, name, version, live, by="watch", url=url)
    if live.rates is not None:
        dropped = regressed(live.rates, _reference_accuracy(store, name, version))
        log(f"{tag} quality probe ({suite.label}): {live.rates}" + (f"; regressed: {dropped}" if dropped else ""))
        return dropped
    previous = _previous(store, name, version)
    if previous is None or previous not in store.versions(name):
        log(
            f"{tag} no quality probe: suite {suite.label} has no assertions and no version was replaced to compare with"
        )
        return []
    seen, dropped = agreement_with_recorded(store, name, previous, live, min_agreement)
    if dropped is None:
        log(f"{tag} no quality probe: suite {suite.label} has no assertions and {seen}")
        return []
    log(f"{tag} quality probe ({suite.label}, no assertions): {seen}" + (f"; {dropped[0]}" if dropped else ""))
    return dropped


def _reference_accuracy(store: ModelStore, name: str, version: str) -> dict | None:
    """What the probe is held to: the replaced (stable) version's recorded accuracy, else the version's own."""
    for candidate in (_previous(store, name, version), version):
        if candidate and candidate in store.versions(name):
            recorded = store.manifest(ModelRef(name, candidate)).eval or {}
            if "accuracy" in recorded.get("metrics", {}):
                return recorded["metrics"]["accuracy"]
    return None


def _baseline(store: ModelStore, name: str, version: str) -> dict | None:
    """The version's own performance baseline, else the one it replaced (same model, same load)."""
    own = store.manifest(ModelRef(name, version)).performance_baseline
    previous = _previous(store, name, version)
    if own or previous is None or previous not in store.versions(name):
        return own
    return store.manifest(ModelRef(name, previous)).performance_baseline
