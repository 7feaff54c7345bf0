"""Incident triage: what is wrong with a running server, read from outside, while things are broken.

The incident_triage runbook (and ``aieng triage``) call this. It is written for the worst case
first: a server that does not answer, answers 503, or serves another version than the store says
is a *finding*, a row of the table with what to do next, never an exception. Each step is a
function of what was observed (an HTTP answer, two ``/metrics`` snapshots, the store's record),
so the diagnosis is tested on recorded snapshots, not only against a live server.

The thresholds are the alert rules' own (``alerts.triage_thresholds``): triage never disagrees
with the alert that paged someone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aieng.observability.alerts import TriageThresholds
from aieng.observability.evidence import Health, Observation, ReleaseState, measure, probe_health, release_state

OK, FAIL, NOTE, UNKNOWN = "OK", "FAIL", "NOTE", "NO DATA"
ROLLBACK_RUNBOOK = "runbooks/rollback.ipynb"
LOAD_RUNBOOK = "runbooks/load_test.ipynb"
WARMUP_RUNBOOK = "runbooks/warmup_verify.ipynb"


@dataclass(frozen=True)
class Finding:
    """One row of the diagnosis: a check, its status, what was measured and what to do if it failed."""

    check: str
    status: str  # OK | FAIL | NOTE (not a fault, but the first suspect) | NO DATA (could not be measured)
    detail: str
    action: str = ""
    runbook: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def diagnose(
    health: Health, observed: Observation | str | None, limits: TriageThresholds, release: ReleaseState | None = None
) -> list[Finding]:
    """The diagnosis table. ``observed`` is an Observation, or the reason the metrics could not be read."""
    findings = [_reachability(health), *_readiness(health)]
    if release is not None:
        findings += _release_findings(health, observed, release)
    if not isinstance(observed, Observation):
        reason = observed or "not measured"
        checks = ("TTFT p99", "e2e p99", "5xx rate", "early EOS", "client aborts", "host memory", "queue", "KV cache")
        return findings + [Finding(check, UNKNOWN, f"no metrics: {reason}") for check in checks]
    o = observed
    ttft = o.p99_s["TTFT"]
    slowest = max(("queue wait", "prefill"), key=lambda layer: o.p99_s[layer])
    waiting_limit = limits.queue_saturation * max(1.0, o.queue_capacity)
    codes = ", ".join(f"{code} x{count:.0f}" for code, count in o.error_codes.items()) or "none"
    return findings + [
        _judged(
            f"TTFT p99 <= {limits.ttft_p99_s}s",
            ttft <= limits.ttft_p99_s,
            f"p99 {ttft * 1000:.0f} ms; slowest before the first token: {slowest} ({o.p99_s[slowest] * 1000:.0f} ms)",
            "queue -> add capacity or shed batch load; prefill -> shorter prompts, lower max_batch_tokens",
            LOAD_RUNBOOK,
        ),
        _judged(
            f"e2e p99 <= objective {o.e2e_objective_s:g}s",
            not o.e2e_objective_s or o.e2e_p99_s <= o.e2e_objective_s,
            f"p99 {o.e2e_p99_s:.2f} s start to last token; median answer {o.output_tokens_p50:.0f} tokens"
            + ("" if o.e2e_objective_s else " (no objective exported: AIENG_SLO_E2E_P99_S)"),
            "long answers (lower max_tokens), queueing (TTFT row) or slow steps (decode step p99): add capacity",
            LOAD_RUNBOOK,
        ),
        _judged(
            f"5xx rate <= {limits.server_error_rate:.0%}",
            o.error_rate <= limits.server_error_rate,
            f"{o.server_errors:.0f} of {o.requests:.0f} requests; error codes: {codes}",
            "grep the server log for the failing trace ids; out_of_memory -> lower max_batch_size; "
            "internal_error after a release -> roll back",
            ROLLBACK_RUNBOOK,
        ),
        _judged(
            f"early EOS <= {limits.early_eos_rate:.0%}",
            o.early_eos <= limits.early_eos_rate,
            f"{o.early_eos:.1%} of {o.finished:.0f} finished generations",
            "the model stops at once: check the prompt template and `aieng model verify`, then roll back",
            ROLLBACK_RUNBOOK,
        ),
        _judged(
            f"client aborts <= {limits.client_abort_rate:.0%}",
            o.abort_rate <= limits.client_abort_rate,
            f"{o.abort_rate:.1%} of requests left before the end"
            + (f" ({', '.join(f'{phase} {n:.0f}' for phase, n in o.aborts.items())})" if o.aborts else ""),
            "users give up: queued -> add capacity; prefill -> long prompts; decode -> slow streams or long answers",
            LOAD_RUNBOOK,
        ),
        _judged(
            f"host memory used <= {limits.host_memory_used:.0%}",
            o.memory_used <= limits.host_memory_used,
            f"{o.memory_used:.1%} in use",
            "lower workers or max_batch_size, or move to a larger host",
        ),
        _judged(
            f"queue <= {limits.queue_saturation:.0%} of capacity, nobody refused",
            o.waiting <= waiting_limit and not o.refused,
            f"{o.running:.0f} running, {o.waiting:.0f} waiting of {o.queue_capacity:.0f}; "
            f"{o.refused:.0f} refused with 429 in {o.seconds:g} s",
            "overloaded: add instances or workers; clients get 429 with Retry-After meanwhile",
            LOAD_RUNBOOK,
        ),
        _judged(
            f"KV cache full in <= {limits.kv_full_share:.0%} of steps",
            o.kv_full_share <= limits.kv_full_share,
            f"{o.kv_rows[0]:.0f} of {o.kv_rows[1]:.0f} rows in use; full with requests waiting in "
            f"{o.kv_full_share:.0%} of steps",
            "requests wait for KV rows: raise AIENG_KV_CACHE_MB or AIENG_MAX_BATCH_SIZE if memory allows, "
            "serve a shorter context, or add workers",
            LOAD_RUNBOOK,
        ),
    ]


def _judged(check: str, ok: bool, detail: str, action: str, runbook: str = "") -> Finding:
    return Finding(check, OK if ok else FAIL, detail, "" if ok else action, "" if ok else runbook)


def _reachability(health: Health) -> Finding:
    if health.answering:
        return Finding("server answering", OK, f"/health/live {health.live}")
    return Finding(
        "server answering",
        FAIL,
        f"{health.url} does not answer: {health.error}",
        "is the process up? `systemctl status aieng`, `journalctl -u aieng -n 100`; restart it. If it "
        "fails to start (verification, load), roll back to the last good version",
        ROLLBACK_RUNBOOK,
    )


def _readiness(health: Health) -> list[Finding]:
    if not health.answering:
        return [Finding("server ready", UNKNOWN, "server not answering")]
    body = health.ready_body
    status = body.get("status", "?")
    rows = []
    if health.ready == 200:
        rows.append(Finding("server ready", OK, f"serving {body.get('model')}@{body.get('version')}"))
    else:
        actions = {
            "starting": ("still loading or warming: wait, then verify", WARMUP_RUNBOOK),
            "failed": (
                "start-up failed: read the server log; a version that cannot load -> roll back",
                ROLLBACK_RUNBOOK,
            ),
            "stuck": ("an engine step hangs: restart the service (the master replaces the worker)", ""),
            "draining": ("shutting down: traffic should move to another instance", ""),
        }
        action, runbook = actions.get(status, ("read the server log", ""))
        phase = f", phase {body['phase']} for {body.get('seconds', 0):.0f} s" if body.get("phase") else ""
        rows.append(Finding("server ready", FAIL, f"/health/ready {health.ready}: {status}{phase}", action, runbook))
    swap = body.get("swap")
    if swap and swap.get("status") == "failed":
        rows.append(
            Finding(
                "last hot swap",
                FAIL,
                f"swap to {swap.get('version')} failed ({swap.get('error')}); still serving {swap.get('previous')}",
                f"the store and the server may disagree: roll the store back to {swap.get('previous')}",
                ROLLBACK_RUNBOOK,
            )
        )
    elif swap:
        rows.append(
            Finding("last hot swap", OK, f"{swap.get('status')}: {swap.get('previous')} -> {swap.get('version')}")
        )
    return rows


def _release_findings(health: Health, observed: Observation | str | None, release: ReleaseState) -> list[Finding]:
    if release.problem:
        return [Finding("store agrees with server", UNKNOWN, release.problem)]
    served = set(observed.served.values()) if isinstance(observed, Observation) else set()
    served |= {str(m.get("version")) for m in health.models if m.get("id") == release.name and m.get("version")}
    rows = []
    if not served:
        rows.append(Finding("store agrees with server", UNKNOWN, f"store current {release.current}; served unknown"))
    elif served == {release.current}:
        rows.append(Finding("store agrees with server", OK, f"every worker serves {release.current}"))
    else:
        rows.append(
            Finding(
                "store agrees with server",
                FAIL,
                f"store current is {release.current}, workers serve {sorted(served)}",
                "the server has not followed the store: POST /admin/reload (or wait AIENG_RELOAD_POLL_S); "
                "if the swap keeps failing, roll the store back to what serves",
                ROLLBACK_RUNBOOK,
            )
        )
    if release.canary:
        version, weight = release.canary["version"], release.canary["weight"]
        rows.append(
            Finding(
                "canary",
                NOTE,
                f"{release.name}@{version} takes {weight:.0%} of unpinned traffic",
                f"if the trouble began with it: aieng release canary {release.name} --abort --reason 'WHY'",
                "runbooks/canary_release.ipynb",
            )
        )
    return rows


def verdict(findings: list[Finding]) -> str:
    failing = [f.check for f in findings if f.failed]
    unknown = [f.check for f in findings if f.status == UNKNOWN]
    if failing:
        return "investigate: " + "; ".join(failing)
    if unknown:
        return "incomplete: no data for " + "; ".join(unknown)
    return "healthy"


def table(findings: list[Finding]) -> str:
    """The diagnosis as fixed-width text: one row per check, the action and runbook under each failure."""
    width = max(len(f.check) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{f.status:7}  {f.check:{width}}  {f.detail}")
        if f.action:
            lines.append(f"{'':7}  {'':{width}}  -> {f.action}" + (f" [{f.runbook}]" if f.runbook else ""))
    return "\n".join(lines)


@dataclass
class Report:
    health: Health
    release: ReleaseState | None
    observed: Observation | str
    findings: list[Finding]

    @property
    def verdict(self) -> str:
        return verdict(self.findings)


def triage(
    base_url: str,
    limits: TriageThresholds,
    *,
    window_s: float = 30.0,
    store_root: str | Path | None = None,
    name: str | None = None,
    fallback: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Report:
    """Every step in order: health, the store's record (with ``store_root``), metrics over ``window_s``,
    the diagnosis. ``name`` defaults to the model the server says it serves, else ``fallback`` (a
    server that does not answer says nothing)."""
    health = probe_health(base_url)
    name = name or health.ready_body.get("model") or next((m["id"] for m in health.models), fallback)
    release = release_state(store_root, name) if store_root is not None and name else None
    observed = measure(base_url, window_s, sleep=sleep) if health.answering else "server not answering"
    return Report(health, release, observed, diagnose(health, observed, limits, release))
