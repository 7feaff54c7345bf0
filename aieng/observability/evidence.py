"""What triage reads, each recorded as found and never raised: the health routes' answers, the
server's work between two ``/metrics`` scrapes, and the store's record of what should serve.

A server that does not answer is a ``Health`` with an ``error``; unreadable metrics are a reason
string in place of an ``Observation``; a missing store is a ``ReleaseState`` with a ``problem``.
``observe`` is a pure function of two snapshots, so the diagnosis is tested on recorded ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from aieng.observability.scrape import Snapshot, delta, histogram_quantile, parse
from aieng.store import ModelStore
from aieng.store.canary_record import read_canary


@dataclass
class Health:
    """The server's answers to the health routes; ``error`` when it did not answer at all."""

    url: str
    live: int | None = None
    ready: int | None = None
    ready_body: dict = field(default_factory=dict)
    models: list[dict] = field(default_factory=list)
    error: str | None = None

    @property
    def answering(self) -> bool:
        return self.error is None and self.live is not None

    def summary(self) -> str:
        if not self.answering:
            return f"{self.url}: NOT ANSWERING ({self.error})"
        serving = [f"{m['id']}@{m.get('version')}" for m in self.models]
        return f"{self.url}: live {self.live}, ready {self.ready} ({self.ready_body.get('status')}), serving {serving}"


def probe_health(base_url: str, timeout: float = 10.0) -> Health:
    """``/health/live``, ``/health/ready`` and ``/v1/models``; a connection error is recorded, not raised."""
    url = base_url.rstrip("/")
    health = Health(url)
    try:
        with httpx.Client(base_url=url, timeout=timeout) as client:
            health.live = client.get("/health/live").status_code
            ready = client.get("/health/ready")
            health.ready, health.ready_body = ready.status_code, _json(ready)
            models = client.get("/v1/models")
            health.models = _json(models).get("data", []) if models.status_code == 200 else []
    except httpx.HTTPError as exc:
        health.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return health


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


@dataclass
class Observation:
    """What the server did between two ``/metrics`` scrapes ``seconds`` apart."""

    seconds: float
    requests: float  # HTTP requests, every route
    finished: float  # generations finished
    http_codes: dict[str, float]
    error_codes: dict[str, float]
    p99_s: dict[str, float]  # layer -> p99 seconds: queue wait, prefill, decode step, inter-token, TTFT
    running: float
    waiting: float
    queue_capacity: float
    memory_used: float  # share of host memory in use at the second scrape
    early_eos: float  # share of finished generations that stopped early
    served: dict[str, str]  # pid -> version, from aieng_model_info
    e2e_p99_s: float = 0.0  # generation requests, start to last token
    e2e_objective_s: float = 0.0  # aieng_slo_e2e_p99_seconds (AIENG_SLO_E2E_P99_S); 0 when not exported
    aborts: dict[str, float] = field(default_factory=dict)  # phase -> clients that left before the end
    kv_rows: tuple[float, float] = (0.0, 0.0)  # KV cache rows used, held (second scrape)
    kv_full_share: float = 0.0  # share of steps that ended with every KV row taken while requests waited
    output_tokens_p50: float = 0.0  # tokens per finished request

    @property
    def abort_rate(self) -> float:
        left = sum(self.aborts.values())
        return left / (self.finished + left) if self.finished + left else 0.0

    @property
    def server_errors(self) -> float:
        return sum(v for code, v in self.http_codes.items() if code.startswith("5"))

    @property
    def refused(self) -> float:
        return self.http_codes.get("429", 0.0)

    @property
    def error_rate(self) -> float:
        return self.server_errors / self.requests if self.requests else 0.0


LAYERS = {
    "queue wait": "aieng_queue_wait_seconds",
    "prefill": "aieng_prefill_seconds",
    "decode step": "aieng_decode_step_seconds",
    "inter-token": "aieng_inter_token_latency_seconds",
    "TTFT": "aieng_time_to_first_token_seconds",
}


def observe(before: Snapshot, after: Snapshot, seconds: float) -> Observation:
    """The window between two snapshots, as the diagnosis reads it (a pure function: testable on recordings)."""
    window = delta(before, after)
    finished = window.value("aieng_requests_finished_total")

    def quantile(histogram: str, q: float = 0.99, **labels) -> float:
        value = window.quantile(histogram, q, **labels)
        return value if value == value else 0.0  # NaN: no samples in the window

    steps = window.value("aieng_step_tokens_count")
    merged: dict[float, float] = {}  # generation routes only: a health probe is not a request a user waits for
    for route in ("/v1/completions", "/v1/chat/completions"):
        for bound, count in window.buckets("aieng_request_duration_seconds", route=route):
            merged[bound] = merged.get(bound, 0.0) + count
    e2e_p99 = histogram_quantile(0.99, sorted(merged.items()))

    return Observation(
        seconds=seconds,
        requests=window.value("aieng_requests_total"),
        finished=finished,
        http_codes={k: v for k, v in sorted(window.by_label("aieng_requests_total", "code").items()) if v},
        error_codes={k: v for k, v in sorted(window.by_label("aieng_request_errors_total", "code").items()) if v},
        p99_s={layer: quantile(histogram) for layer, histogram in LAYERS.items()},
        running=after.value("aieng_requests_running"),
        waiting=after.value("aieng_requests_waiting"),
        queue_capacity=after.value("aieng_queue_capacity"),
        memory_used=1
        - after.value("aieng_host_memory_available_bytes") / max(1.0, after.value("aieng_host_memory_total_bytes")),
        early_eos=window.value("aieng_eos_early_total") / finished if finished else 0.0,
        served={
            dict(labels).get("pid", "-"): dict(labels).get("version", "?")
            for (name, labels), value in after.samples.items()
            if name == "aieng_model_info" and value == 1
        },
        e2e_p99_s=e2e_p99 if e2e_p99 == e2e_p99 else 0.0,
        e2e_objective_s=max(
            (v for (name, _), v in after.samples.items() if name == "aieng_slo_e2e_p99_seconds"), default=0.0
        ),
        aborts={k: v for k, v in sorted(window.by_label("aieng_client_aborts_total", "phase").items()) if v},
        kv_rows=(after.value("aieng_kv_cache_rows_used"), after.value("aieng_kv_cache_rows_total")),
        kv_full_share=window.value("aieng_kv_cache_full_steps_total") / steps if steps else 0.0,
        output_tokens_p50=quantile("aieng_output_tokens", 0.5),
    )


def measure(
    base_url: str, window_s: float, *, timeout: float = 10.0, sleep: Callable[[float], None] = time.sleep
) -> Observation | str:
    """Two scrapes ``window_s`` apart; the reason as a string when ``/metrics`` cannot be read."""
    url = base_url.rstrip("/") + "/metrics"
    snapshots = []
    for i in range(2):
        if i:
            sleep(window_s)
        try:
            answer = httpx.get(url, timeout=timeout)
        except httpx.HTTPError as exc:
            return f"{url} did not answer: {type(exc).__name__}: {exc}"
        if answer.status_code != 200:
            return f"{url} answered {answer.status_code}"
        snapshots.append(parse(answer.text))
    return observe(snapshots[0], snapshots[1], window_s)


@dataclass
class ReleaseState:
    """What the store says should serve: current, the canary beside it, the last history events."""

    name: str
    current: str | None
    canary: dict | None  # {"version", "weight"}
    history: list[dict]
    problem: str | None = None  # why the store could not be read

    def lines(self) -> list[str]:
        if self.problem:
            return [f"store: {self.problem}"]
        canary = f"{self.canary['version']} at {self.canary['weight']:.0%}" if self.canary else "none"
        out = [f"{self.name}: current {self.current}, canary {canary}", "recent history:"]
        for event in self.history:
            moved = f"{event.get('from')} -> {event.get('to')}" if "to" in event else ""
            out.append(
                f"  {event.get('ts', '?'):25} {event.get('action', '?'):16} {moved:12} "
                f"{event.get('actor', '')}: {event.get('reason', '')}"
            )
        return out


def release_state(store_root: str | Path, name: str, last: int = 5) -> ReleaseState:
    """The store's record for ``name``; a missing store or model is a state, not an error."""
    store = ModelStore(Path(store_root))
    if name not in store.names():
        return ReleaseState(name, None, None, [], problem=f"{name!r} is not in the store at {store.root}")
    canary = read_canary(store, name)
    return ReleaseState(name, store.current(name), canary.to_dict() if canary else None, store.history(name)[-last:])
