"""Prometheus metrics. Names are a public contract: dashboards and alert rules depend on them.

Buckets are chosen for LLM work and documented with each family:
- ``LATENCY_BUCKETS`` (request duration, TTFT, queue wait, prefill): 5 ms … 60 s, dense
  between 50 ms and 2.5 s where interactive SLOs live;
- ``STEP_BUCKETS`` (decode step, inter-token latency): 1 ms … 2.5 s, a decode step of a small
  model on CPU is milliseconds, a large one on a loaded host is hundreds;
- ``LOAD_BUCKETS`` (model load): 0.1 s … 10 min;
- ``BATCH_BUCKETS`` (rows per step): powers of two up to 256;
- ``TOKEN_BUCKETS`` (output tokens per request, tokens per engine step): powers of two up to 16k.
"""

from __future__ import annotations

import bisect
import contextvars

from prometheus_client import Counter, Gauge, Histogram

LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 20, 30, 60)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# -- model (loading) ------------------------------------------------------------------------------
MODEL_LOAD_SECONDS = Histogram(
    "aieng_model_load_seconds",
    "Time to verify and load a model version, seconds.",
    ["model", "version"],
    buckets=LOAD_BUCKETS,
)
MODEL_LOAD_ERRORS = Counter(
    "aieng_model_load_errors_total", "Model loads that failed, by version and error code.", ["model", "version", "code"]
)
# One sample per live worker (``pid`` label): after a hot swap every worker must show the new
# version with 1 (the old one with 0), and ``aieng model promote --reload`` checks exactly that.
MODEL_INFO = Gauge(
    "aieng_model_info",
    "The model version each worker serves (1) or served before a hot swap (0).",
    ["name", "version", "sha256"],
    multiprocess_mode="liveall",
)
CANARY_WEIGHT = Gauge(
    "aieng_canary_weight",
    "Share of unpinned requests a worker sends to the canary version.",
    ["version"],
    multiprocess_mode="liveall",
)
CANARY_LOADED = Gauge(
    "aieng_canary_loaded",
    "1 while a worker holds this canary version loaded, at any weight (0 too).",
    ["version"],
    multiprocess_mode="liveall",
)
MODEL_SWAPS = Counter(
    "aieng_model_swaps_total", "Hot swaps of the served version, by outcome (ok, failed).", ["outcome"]
)

# -- HTTP ---------------------------------------------------------------------------------------
# Request metrics carry the ``version`` that served the request, so versions live in one server
# (a hot swap's old and new, a canary beside its stable) compare in PromQL: error rate, TTFT, ITL,
# latency, early EOS per version. ``serving_version`` is that version within a request's context:
# the worker's current one from the first byte, the one a generation route queued on after that.
serving_version: contextvars.ContextVar[str] = contextvars.ContextVar("aieng_serving_version", default="")

REQUESTS = Counter(
    "aieng_requests_total", "HTTP requests by route, status code and serving version.", ["route", "code", "version"]
)
REQUEST_DURATION = Histogram(
    "aieng_request_duration_seconds",
    "End-to-end request latency, seconds.",
    ["route", "version"],
    buckets=LATENCY_BUCKETS,
)

# -- scheduler and engine -------------------------------------------------------------------------
QUEUE_WAIT = Histogram(
    "aieng_queue_wait_seconds",
    "Time from submission to joining the batch, seconds.",
    ["priority", "version"],
    buckets=LATENCY_BUCKETS,
)
PREFILL_SECONDS = Histogram(
    "aieng_prefill_seconds", "Duration of one prefill (a group of joiners), seconds.", buckets=LATENCY_BUCKETS
)
DECODE_STEP_SECONDS = Histogram(
    "aieng_decode_step_seconds", "Duration of one decode step for the whole batch, seconds.", buckets=STEP_BUCKETS
)
BATCH_SIZE = Histogram("aieng_batch_size", "Rows in the batch at each decode step.", buckets=BATCH_BUCKETS)
STEP_TOKENS = Histogram(
    "aieng_step_tokens",
    "Tokens one engine step processed: prompt tokens prefilled plus rows decoded.",
    buckets=TOKEN_BUCKETS,
)
# KV cache occupancy, summed over workers: rows (one per running sequence) and the tokens they keep,
# each against what the engines hold. Rows full while requests wait is the KV pressure signal.
KV_ROWS_USED = Gauge(
    "aieng_kv_cache_rows_used", "KV cache rows held by running sequences.", multiprocess_mode="livesum"
)
KV_ROWS_TOTAL = Gauge("aieng_kv_cache_rows_total", "KV cache rows the engines hold.", multiprocess_mode="livesum")
KV_TOKENS_USED = Gauge(
    "aieng_kv_cache_tokens_used", "Tokens kept in the KV cache by running sequences.", multiprocess_mode="livesum"
)
KV_TOKENS_TOTAL = Gauge(
    "aieng_kv_cache_tokens_total", "KV cache rows held times the context length.", multiprocess_mode="livesum"
)
KV_FULL_STEPS = Counter(
    "aieng_kv_cache_full_steps_total",
    "Engine steps that ended with every KV cache row taken while requests waited for one.",
)
# The prefix cache (AIENG_PREFIX_CACHE): admitted prompt tokens found in it (hit) or prefilled
# (miss), tokens dropped from free rows to make room (evicted), and what free rows keep now.
# hit / (hit + miss) is the share of prompt work the cache saved.
PREFIX_CACHE_TOKENS = Counter(
    "aieng_prefix_cache_tokens_total", "Prompt tokens read from the prefix cache (hit) or prefilled (miss).", ["result"]
)
PREFIX_CACHE_EVICTED = Counter(
    "aieng_prefix_cache_evicted_tokens_total", "Tokens the prefix cache dropped to give their KV row to a new request."
)
PREFIX_CACHE_KEPT = Gauge(
    "aieng_prefix_cache_kept_tokens",
    "Tokens the KV cache rows no request holds keep for reuse: the prefix cache's occupancy.",
    multiprocess_mode="livesum",
)
REQUESTS_RUNNING = Gauge("aieng_requests_running", "Requests in the running batch.", multiprocess_mode="livesum")
REQUESTS_WAITING = Gauge("aieng_requests_waiting", "Requests waiting to join the batch.", multiprocess_mode="livesum")
TOKENS_PER_SECOND = Gauge(
    "aieng_tokens_per_second", "Decode throughput over the last few seconds, tokens/s.", multiprocess_mode="livesum"
)

# -- requests (recorded on the event loop, closest to the client) --------------------------------
TIME_TO_FIRST_TOKEN = Histogram(
    "aieng_time_to_first_token_seconds",
    "Time from submission to the first generated token, seconds.",
    ["priority", "version"],
    buckets=LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "aieng_inter_token_latency_seconds",
    "Time between consecutive tokens of a request.",
    ["version"],
    buckets=STEP_BUCKETS,
)
PROMPT_TOKENS = Counter("aieng_prompt_tokens_total", "Prompt tokens of finished requests.", ["version"])
GENERATION_TOKENS = Counter("aieng_generation_tokens_total", "Tokens generated.", ["version"])
REQUEST_ERRORS = Counter(
    "aieng_request_errors_total", "Requests that ended in an error, by error code.", ["code", "version"]
)
REQUESTS_FINISHED = Counter(
    "aieng_requests_finished_total", "Generations that finished, by finish reason.", ["finish_reason", "version"]
)
OUTPUT_TOKENS = Histogram(
    "aieng_output_tokens", "Tokens generated per finished request.", ["version"], buckets=TOKEN_BUCKETS
)
CLIENT_ABORTS = Counter(
    "aieng_client_aborts_total",
    "Requests whose client left before the end (disconnected, or read its stream too slowly), by the "
    "phase the request was in: queued, prefill (admitted, no token yet) or decode.",
    ["phase", "version"],
)
ABORT_PHASES = ("queued", "prefill", "decode")
EOS_EARLY = Counter(
    "aieng_eos_early_total",
    "Generations that hit EOS within their first 10 tokens while max_tokens allowed more.",
    ["version"],
)
OUTPUT_GUARD = Counter(
    "aieng_output_guard_total",
    "Answers the output guard caught, by check (empty, repetition, json, blocklist, hook) and "
    "action (flag: passed on and marked; fallback: replaced).",
    ["check", "action"],
)

# Opt-in request capture (AIENG_CAPTURE_DIR, server/http/capture.py): what was kept, and what was
# not although it qualified, so a capture with holes in it says so.
CAPTURE_RECORDS = Counter(
    "aieng_capture_records_total",
    "Requests written to the capture files, by reason (sampled, guard, error).",
    ["reason"],
)
CAPTURE_DROPPED = Counter(
    "aieng_capture_dropped_total",
    "Captured requests not written, by why (queue_full, redacted, redact_error, too_large, write_error).",
    ["why"],
)

# -- capacity and resources -----------------------------------------------------------------------
OOM = Counter(
    "aieng_oom_total", "Engine forwards that ran out of memory and were retried in halves, by phase.", ["phase"]
)
OOM_DEGRADED = Counter(
    "aieng_oom_degraded_total",
    "Requests that ran out of memory alone and, with AIENG_OOM_DEGRADE=1, ended early with what "
    "they had generated (finish_reason length) instead of an error.",
    ["version"],
)
QUEUE_CAPACITY = Gauge("aieng_queue_capacity", "max_queue of a worker.", multiprocess_mode="livesum")
SLO_E2E_P99 = Gauge(
    "aieng_slo_e2e_p99_seconds",
    "The end-to-end p99 latency objective of generation requests (AIENG_SLO_E2E_P99_S); alerts compare with it.",
    multiprocess_mode="max",
)
TOKENS_PER_SECOND_BASELINE = Gauge(
    "aieng_tokens_per_second_baseline",
    "Decode tokens/s from the manifest's performance_baseline (0 if none).",
    multiprocess_mode="max",
)
PROCESS_RESIDENT = Gauge(
    "aieng_process_resident_memory_bytes", "Resident memory of each aieng process.", multiprocess_mode="livesum"
)
HOST_MEMORY_TOTAL = Gauge("aieng_host_memory_total_bytes", "Host memory.", multiprocess_mode="max")
# The latest reading of any live process: "min" counted the master, which imports the metrics but
# never takes a reading, and so reported 0 bytes available on a healthy host.
HOST_MEMORY_AVAILABLE = Gauge(
    "aieng_host_memory_available_bytes", "Host memory available to new allocations.", multiprocess_mode="livemostrecent"
)
# Per GPU (device="cuda:N"), summed over the worker processes that use it; aieng.host.gpus reads them.
CUDA_ALLOCATED = Gauge(
    "aieng_cuda_memory_allocated_bytes",
    "CUDA memory held by tensors, per GPU.",
    ["device"],
    multiprocess_mode="livesum",
)
CUDA_RESERVED = Gauge(
    "aieng_cuda_memory_reserved_bytes",
    "CUDA memory reserved by the caching allocator, per GPU (reserved - allocated = fragmentation).",
    ["device"],
    multiprocess_mode="livesum",
)
CUDA_TOTAL = Gauge("aieng_cuda_memory_total_bytes", "Memory of each GPU.", ["device"], multiprocess_mode="livemax")
GPU_UTILIZATION = Gauge(
    "aieng_gpu_utilization_ratio",
    "Share of the last sample period a kernel ran on the GPU (NVML; absent without nvidia-ml-py).",
    ["device"],
    multiprocess_mode="livemax",
)

EARLY_EOS_TOKENS = 10


def update_resource_gauges() -> None:
    """Memory gauges for this process (called on scrapes and, throttled, from the engine loop)."""
    import psutil

    from aieng.host.gpus import memory_snapshot

    PROCESS_RESIDENT.set(psutil.Process().memory_info().rss)
    memory = psutil.virtual_memory()
    HOST_MEMORY_TOTAL.set(memory.total)
    HOST_MEMORY_AVAILABLE.set(memory.available)
    for gpu in memory_snapshot():  # empty without CUDA, or before this process initialised it
        CUDA_ALLOCATED.labels(device=gpu.device).set(gpu.allocated)
        CUDA_RESERVED.labels(device=gpu.device).set(gpu.reserved)
        CUDA_TOTAL.labels(device=gpu.device).set(gpu.total)
        if gpu.utilization is not None:
            GPU_UTILIZATION.labels(device=gpu.device).set(gpu.utilization)


def observe_many(histogram, values: list[float]) -> None:
    """``histogram.observe(v)`` for every v, with one increment per touched bucket instead of one per value.

    Why: in multiprocess mode each observation is a locked write to a memory-mapped file, and
    inter-token latency is observed once per streamed token. Bucketing a request's values here
    and adding the counts costs a fraction of that. It reads prometheus_client's ``_upper_bounds``,
    ``_buckets`` and ``_sum`` (stable for years); if they ever move, it falls back to plain
    ``observe``.
    """
    if not values:
        return
    bounds, buckets, total = (getattr(histogram, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        index = bisect.bisect_left(bounds, value)  # the first bucket whose upper bound is >= value
        counts[index] = counts.get(index, 0) + 1
    for index, count in counts.items():
        buckets[index].inc(count)
    total.inc(sum(values))


def record_finished(event, *, max_tokens: int, version: str) -> None:
    """Counters for a generation's final event. Errors are counted where the client is told
    (the error handler, or the SSE error chunk), so each is counted once."""
    if event.error is not None:
        return
    REQUESTS_FINISHED.labels(finish_reason=event.finish_reason, version=version).inc()
    OUTPUT_TOKENS.labels(version=version).observe(event.completion_tokens)
    PROMPT_TOKENS.labels(version=version).inc(event.prompt_tokens)
    GENERATION_TOKENS.labels(version=version).inc(event.completion_tokens)
    if getattr(event, "finish_cause", None) == "out_of_memory":  # the degraded mode's ending (engine/oom.py)
        OOM_DEGRADED.labels(version=version).inc()
    if (
        getattr(event, "finish_cause", None) == "eos"
        and event.completion_tokens <= EARLY_EOS_TOKENS
        and max_tokens > EARLY_EOS_TOKENS
    ):
        EOS_EARLY.labels(version=version).inc()


def count_abort(phase: str, version: str) -> None:
    """``aieng_client_aborts_total{phase, version}``: a client left before its request finished."""
    CLIENT_ABORTS.labels(phase=phase, version=version).inc()


def count_error(code: str) -> None:
    """``aieng_request_errors_total{code, version}`` for the request in this context."""
    REQUEST_ERRORS.labels(code=code, version=serving_version.get()).inc()


def zero_series(version: str, error_codes) -> None:
    """Create ``version``'s request series at 0, so ``rate()`` and alerts see a version from its
    first request on (a counter that appears at 1 has no increase to show)."""
    for code in error_codes:
        REQUEST_ERRORS.labels(code=code, version=version)
    for phase in ("prefill", "decode"):
        OOM.labels(phase=phase)
    for result in ("hit", "miss"):
        PREFIX_CACHE_TOKENS.labels(result=result)
    EOS_EARLY.labels(version=version)
    for phase in ABORT_PHASES:
        CLIENT_ABORTS.labels(phase=phase, version=version)
    OOM_DEGRADED.labels(version=version)
    GENERATION_TOKENS.labels(version=version)
    PROMPT_TOKENS.labels(version=version)
