"""``aieng release canary``: shift traffic to a new version step by step, judging it against the
stable version on the same live traffic, and promote it or roll it back on its own.

Why against stable and not against a recorded baseline: both versions serve the same mix at the
same moment on the same machine, so load, noise and the time of day cancel out. The server's
request metrics carry ``version`` (``aieng.observability.metrics``), so one scrape gives both.
Where the numbers come from is ``aieng.release.sources``: the server's ``/metrics`` by default, a
Prometheus server when given; either way the log prints the PromQL of every check.

Before the first step: the release gate (the candidate's eval against current's), the server's
room for it (``canary_room``: refused before anything is written when it cannot fit) and a shadow
quality probe (held-out prompts per family, sent to each version pinned by ``name@V``; the canary
is loaded at weight 0 for it, so a wrong version is caught before any user meets it). At each
step: the store's canary record gets the step's weight, every worker converges on it (checked on
``/metrics``), then one check per ``interval``: ``compare`` on what each version served in it.
A failed check repeats the step; ``max_failed_checks`` of them abort: the canary is cleared
(workers unload it), the reason goes to history. A step passes only on evidence
(``StepEvidence``): a clean check once the canary has served enough requests at that step, for
long enough, and one check of the step had enough to judge its latency; while traffic is too thin
the step waits, and past its deadline it ends with the decision its policy names (hold, roll back
or promote), said and recorded, never a silent pass. The last step passed, the canary is promoted
through the gate and becomes current (workers adopt its engine as it is). Defaults follow Flagger's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from aieng.errors import ConfigError
from aieng.evaluation.gate import GateThresholds
from aieng.release.canary_room import CanaryLoadFailed, load_failure, room_refusal
from aieng.release.decision import Window
from aieng.release.probe import shadow_probe
from aieng.release.promotion import judge, promote
from aieng.release.reload import admin_reload, reload_server, worker_canaries, worker_versions
from aieng.release.served_answers import record as record_answers
from aieng.release.sources import PrometheusMetrics, ServerMetrics, promql
from aieng.store import ModelRef, ModelStore
from aieng.store.canary_record import clear_canary, set_canary

ACTOR = "aieng release canary"


@dataclass(frozen=True)
class CanaryThresholds:
    min_success_rate: float = 0.99  # of the canary's requests (5xx and engine errors fail)
    max_latency_ratio: float = 1.5  # canary p99 end-to-end latency / stable's
    max_ttft_ratio: float = 1.5  # canary p99 time to first token / stable's
    max_early_eos_rise: float = 0.10  # canary early-EOS rate minus stable's
    latency_slack_s: float = 0.05  # and at least this much slower: below it, bucket resolution and noise
    min_requests: int = 20  # canary requests a check needs to judge latency (fewer: judged on errors only)
    quality_margin: float = 0.25  # a probe family this far below stable's score fails
    min_probe_agreement: float = 0.8  # a suite without assertions: share of answers equal to stable's


WAIT, PASS, FAIL, TIMEOUT = "wait", "pass", "fail", "timeout"
POLICIES = ("hold", "rollback", "promote")


@dataclass(frozen=True)
class StepEvidence:
    """What a canary step must have seen before it may pass, and what ends a step traffic never
    fills. Defaults suit a busy service (Flagger and Argo Rollouts also refuse to advance on too
    few requests); a quiet one lowers ``min_requests`` or accepts a ``promote`` policy, knowingly."""

    min_requests: int = 100  # canary requests over the whole step, all its checks together
    min_seconds: float = 0.0  # and this long at the step's weight
    max_wait_s: float | None = None  # then the policy decides; None: 10 check intervals
    on_timeout: str = "hold"  # hold (stop here, canary kept) | rollback | promote

    def __post_init__(self):
        if self.on_timeout not in POLICIES:
            raise ConfigError(f"on_timeout {self.on_timeout!r}: one of {', '.join(POLICIES)}")
        if self.min_requests < 0 or self.min_seconds < 0:
            raise ConfigError("a step's minimum requests and seconds are >= 0")


def step_verdict(
    evidence: StepEvidence, requests: int, seconds: float, failures: list, max_wait_s: float, judged: bool = True
) -> str:
    """A check's verdict on its step: ``fail`` (a rule fired), ``pass`` (clean, enough requests for long
    enough, and some check ``judged`` its latency), ``timeout`` (clean but thin, past the deadline) or ``wait``."""
    if failures:
        return FAIL
    if requests >= evidence.min_requests and seconds >= evidence.min_seconds and judged:
        return PASS
    return TIMEOUT if seconds >= max_wait_s else WAIT


def compare(canary: Window, stable: Window, thresholds: CanaryThresholds = CanaryThresholds()) -> list[dict]:
    """Every rule the canary fails against stable in one check: ``[{rule, message}]``."""
    failures = []
    if canary.requests and 1 - canary.error_rate < thresholds.min_success_rate:
        failures.append(
            {
                "rule": "success_rate",
                "message": f"{1 - canary.error_rate:.1%} of {canary.requests} "
                f"requests succeeded (< {thresholds.min_success_rate:.0%})",
            }
        )
    if canary.requests >= thresholds.min_requests:
        for rule, mine, theirs, limit in (
            ("latency", canary.latency_p99_s, stable.latency_p99_s, thresholds.max_latency_ratio),
            ("ttft", canary.ttft_p99_s, stable.ttft_p99_s, thresholds.max_ttft_ratio),
        ):
            if mine is not None and theirs and mine / theirs > limit and mine - theirs > thresholds.latency_slack_s:
                failures.append(
                    {
                        "rule": rule,
                        "message": f"p99 {mine:.3f} s is {mine / theirs:.1f}x stable's {theirs:.3f} s (limit {limit}x)",
                    }
                )
        rise = canary.early_eos_rate - (stable.early_eos_rate if stable.requests else 0.0)
        if rise > thresholds.max_early_eos_rise:
            failures.append(
                {
                    "rule": "early_eos",
                    "message": f"early-EOS rate {canary.early_eos_rate:.1%} is {rise:.1%} above stable's",
                }
            )
    return failures


@dataclass
class CanaryResult:
    outcome: str  # promoted | rolled_back | refused | held (a step's traffic never came; the canary stays)
    rule: str | None = None
    reason: str = ""
    checks: list[dict] = field(default_factory=list)


def run_canary(
    store: ModelStore,
    name: str,
    version: str,
    url: str,
    *,
    steps: list[int],
    interval_s: float,
    max_failed_checks: int = 2,
    thresholds: CanaryThresholds = CanaryThresholds(),
    evidence: StepEvidence = StepEvidence(),
    gate: GateThresholds | None = None,
    probe: bool = True,
    token: str | None = None,
    metrics: ServerMetrics | PrometheusMetrics | None = None,
    converge_timeout_s: float = 300.0,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> CanaryResult:
    """``url`` is the server (the store's changes reach it through ``/admin/reload``); ``metrics``
    is where the checks read, the server's ``/metrics`` unless a Prometheus is given. Workers that
    do not take the canary within ``converge_timeout_s`` (it failed to load: no memory, bad
    weights) end the release rolled back, the record cleared, not a timeout left behind."""
    metrics = metrics or ServerMetrics(url)
    stable = store.current(name)
    tag = f"[canary {name}@{version}]"
    decision = judge(store, name, version, stable, gate)
    no_room = None if not decision.passed else room_refusal(store, name, version, url, token)
    if not decision.passed or no_room:
        reason = no_room or "; ".join(decision.messages)
        store.record_event(
            name,
            {
                "action": "canary_refused",
                "from": stable,
                "to": version,
                "reason": reason,
                "actor": ACTOR,
                "gate": {"decision": decision.to_dict()},
            },
        )
        log(f"{tag} refused by the {'GPU memory check' if no_room else 'release gate'}: {reason}")
        return CanaryResult("refused", "memory" if no_room else decision.rules_fired[0], reason)
    log(f"{tag} release gate passed against {stable}")
    checks: list[dict] = []

    def not_loaded(exc: TimeoutError) -> CanaryResult:
        late = f"the workers did not load it within {converge_timeout_s:g} s ({exc}); the server log says why"
        why = f"a worker could not load it: {exc}" if isinstance(exc, CanaryLoadFailed) else late
        return _abort(store, name, version, url, token, "load", f"load: {why}", checks, log, sleep)

    if probe:  # loaded at weight 0: only the probe's pinned requests reach it, no user yet
        set_canary(store, name, version, 0.0, reason="canary loaded for the shadow probe")
        try:
            _converge(url, version, 0.0, token, sleep, converge_timeout_s)
        except TimeoutError as exc:
            return not_loaded(exc)
        suite = store.suite(ModelRef(name, version)) or store.suite(ModelRef(name, stable))
        if suite is None:
            log(f"{tag} no shadow quality probe: neither version has an eval suite registered")
        else:
            seen, dropped, canary_answers, stable_answers = shadow_probe(
                url,
                name,
                version,
                stable,
                suite,
                margin=thresholds.quality_margin,
                min_agreement=thresholds.min_probe_agreement,
            )
            log(f"{tag} shadow quality probe: {seen}")
            # Kept with each version: after promotion stable is no longer served, and the watchdog
            # holds the new version to what stable answered here (``served_answers``).
            for answered, probe_result in ((stable, stable_answers), (version, canary_answers)):
                record_answers(store, name, answered, probe_result, by="canary shadow probe", url=url)
            if dropped:
                return _abort(
                    store,
                    name,
                    version,
                    url,
                    token,
                    "quality",
                    f"quality: probe: {'; '.join(dropped)}",
                    checks,
                    log,
                    sleep,
                )
    log(f"{tag} checks read {metrics.describe()} every {interval_s:g} s; their questions as PromQL:")
    for who, v in (("canary", version), ("stable", stable)):
        for key, query in promql(v, interval_s, metrics.selector).items():
            log(f"{tag}   {who} {key}: {query}")
    max_wait_s = evidence.max_wait_s if evidence.max_wait_s is not None else 10 * interval_s
    log(
        f"{tag} a step passes on a clean check after {evidence.min_requests} canary requests and "
        f"{evidence.min_seconds:g} s; past {max_wait_s:g} s without them: {evidence.on_timeout}"
    )
    failed, reference = 0, None
    for percent in steps:
        set_canary(store, name, version, percent / 100, reason=f"canary step {percent}%")
        try:
            _converge(url, version, percent / 100, token, sleep, converge_timeout_s)
        except TimeoutError as exc:
            return not_loaded(exc)
        seen, seconds, judged = 0, 0.0, False  # the step's evidence so far
        while True:
            windows = metrics.measure([version, stable], interval_s, sleep)
            mine, theirs = windows[version], windows[stable]
            seen, seconds = seen + mine.requests, seconds + mine.seconds
            reference = theirs if theirs.requests >= thresholds.min_requests else reference or theirs
            failures = compare(mine, reference, thresholds)
            judged = judged or mine.requests >= thresholds.min_requests  # latency could be judged
            verdict = step_verdict(evidence, seen, seconds, failures, max_wait_s, judged)
            checks.append(
                {
                    "step": percent,
                    "canary": _brief(mine),
                    "stable": _brief(theirs),
                    "failures": failures,
                    "step_requests": seen,
                    "verdict": verdict,
                }
            )
            log(
                f"{tag} {percent:3d}%: canary {mine.requests} requests ({seen} this step, {seconds:.0f} s), "
                f"stable {theirs.requests}: "
                + (
                    "; ".join(f"{f['rule']}: {f['message']}" for f in failures)
                    if failures
                    else {PASS: "ok", WAIT: "clean, waiting for evidence", TIMEOUT: "clean, but too little traffic"}[
                        verdict
                    ]
                )
            )
            if verdict == PASS:
                break
            if verdict == WAIT:
                continue
            if verdict == TIMEOUT:
                thin = f"{seen} canary requests in {seconds:.0f} s at {percent}% (need {evidence.min_requests})"
                if evidence.on_timeout == "promote":
                    log(f"{tag} {percent}%: {thin}: passing by policy (on_timeout=promote)")
                    break
                if evidence.on_timeout == "rollback":
                    return _abort(store, name, version, url, token, "insufficient_traffic", thin, checks, log, sleep)
                return _hold(store, name, version, percent, thin, checks, log)
            failed += 1
            if failed >= max_failed_checks:
                return _abort(
                    store,
                    name,
                    version,
                    url,
                    token,
                    failures[0]["rule"],
                    "; ".join(f"{f['rule']}: {f['message']}" for f in failures),
                    checks,
                    log,
                    sleep,
                )
    promote(store, name, version, thresholds=gate, reason=f"canary passed {','.join(map(str, steps))}%", actor=ACTOR)
    clear_canary(store, name, reason="promoted")
    reload_server(url, version, token=token)  # every worker adopts the canary's engine as its stable one
    _converge(url, None, 0.0, token, sleep)
    store.record_event(
        name,
        {
            "action": "canary_promoted",
            "from": stable,
            "to": version,
            "actor": ACTOR,
            "reason": f"every step passed ({len(checks)} checks)",
            "checks": checks,
        },
    )
    log(f"{tag} promoted: {version} is current")
    return CanaryResult("promoted", None, "every step passed", checks)


def _hold(store, name, version, percent, why, checks, log) -> CanaryResult:
    """Stop at this step with the canary kept at its weight: too little traffic to judge is not a
    verdict. The operator re-runs later, or aborts (``aieng release canary NAME --abort``)."""
    reason = f"{why}: held at {percent}%; re-run the release later, or abort it"
    store.record_event(
        name, {"action": "canary_held", "from": store.current(name), "to": version, "reason": reason, "actor": ACTOR}
    )
    log(f"{ACTOR} {name}@{version}: {reason}")
    return CanaryResult("held", "insufficient_traffic", reason, checks)


def _abort(store, name, version, url, token, rule, reason, checks, log, sleep) -> CanaryResult:
    clear_canary(store, name, reason=f"canary aborted: {reason}")
    admin_reload(url, token)
    _converge(url, None, 0.0, token, sleep)
    store.record_event(
        name,
        {
            "action": "canary_rolled_back",
            "from": version,
            "to": store.current(name),
            "rule": rule,
            "reason": reason,
            "actor": ACTOR,
            "checks": checks,
        },
    )
    log(f"[canary {name}@{version}] rolled back: {reason}")
    return CanaryResult("rolled_back", rule, reason, checks)


def abort_canary(
    store: ModelStore,
    name: str,
    reason: str,
    *,
    url: str | None = None,
    token: str | None = None,
    actor: str | None = None,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Return all of ``name``'s traffic to its stable version: clear the canary record (history
    gets ``canary_cleared`` with the reason and who) and, given the server's ``url``, have every
    worker re-read the store and wait until none serves the canary. The version aborted, or None
    when there was no canary: a second abort changes nothing, so an incident step may be re-run.

    Why a reason is required: an abort is an operator's override of a release in progress, and
    history must say why, as it does for ``--force``."""
    if not reason.strip():
        raise ConfigError("aborting a canary needs a reason (--reason WHY): it is recorded in history.jsonl")
    event = clear_canary(store, name, reason=f"canary aborted: {reason}", actor=actor)
    if event is None:
        log(f"{name}: no canary in the store: nothing to abort")
    else:
        log(f"{name}: canary {event['from']} cleared; {event['to']} serves all traffic in the store")
    if url:
        try:
            _converge(url, None, 0.0, token, sleep)
        except TimeoutError as exc:
            raise ConfigError(
                f"the store's canary of {name} is cleared, but {exc}; check aieng_canary_weight on {url}/metrics "
                f"and run the abort again (it re-sends the reload)"
            ) from None
        log(f"{url}: no worker serves a canary of {name}")
    return None if event is None else event["from"]


def _converge(url: str, version: str | None, weight: float, token: str | None, sleep, timeout_s: float = 300.0) -> None:
    """Ask the server to re-read the store, then wait until every live worker (each one's
    ``aieng_model_info``) has the canary at ``weight`` (``None``: until none has one)."""
    admin_reload(url, token)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if version is not None and (failed := load_failure(url, token, version)):  # the answering worker's reason
            raise CanaryLoadFailed(failed)
        seen, workers = worker_canaries(url), set(worker_versions(url))
        if (version is None and not seen) or (
            workers and set(seen) >= workers and all(v == (version, weight) for v in seen.values())
        ):
            return
        sleep(0.25)
    raise TimeoutError(f"the workers did not converge on canary {version} at {weight:.0%}: {worker_canaries(url)}")


def _brief(window: Window) -> dict:
    keep = ("requests", "errors", "early_eos", "latency_p99_s", "ttft_p99_s")
    return {k: v for k, v in asdict(window).items() if k in keep}
