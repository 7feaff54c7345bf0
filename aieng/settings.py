"""Settings from ``AIENG_*`` environment variables, overridable by CLI flags.

A plain dataclass rather than a settings framework: the fields are few, the CLI passes
overrides explicitly, and the same object is handed down to every component that needs it.
``RuntimeConfig.from_settings`` (``aieng.server.process.runtime``) is the one place where they
become the engine's, the scheduler's and the loader's configs. Defaults live here and only here:
those configs take theirs from ``DEFAULTS`` (``tests/test_settings.py`` builds the engine config
the way ``aieng serve`` does and the way a notebook does, and compares them).

Each field's ``help`` is the text of ``aieng serve --help`` and of the settings table in
``docs/reference.md`` (regenerate it with ``python -m aieng.settings``; a test compares).
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

#: AIENG_WEIGHT_FORMATS's choices (engine/native/formats.py says what each runs)
WEIGHT_FORMATS = ("auto", "float32", "bfloat16", "float32-packed", "bfloat16-packed", "int8", "int4")


def user_cache_dir() -> Path:
    """This user's cache folder for aieng (the XDG base-directory rule, as pip and Hugging Face use):
    what is kept there is rebuilt if deleted, and is the same for every checkout and working
    directory, so a second clone or a server started elsewhere finds it warm."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aieng"


def _setting(default, help: str, **kwargs):
    if callable(default):  # a default_factory
        return field(default_factory=default, metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class Settings:
    store: Path = _setting(lambda: Path("var/store"), "model store root", shown="./var/store")
    model: str = _setting("demo", "N or N@V to serve (N alone: N's current version)")
    host: str = _setting("127.0.0.1", "bind address: loopback by default; set 0.0.0.0 behind a proxy deliberately")
    port: int = _setting(8000, "bind port")
    workers: str = _setting("auto", "auto or a count of worker processes (see --workers auto below)")
    torch_threads: int = _setting(0, "torch threads per worker; 0 = the worker plan decides")
    device: str = _setting("auto", "auto | cpu | cuda | cuda:N (auto: CUDA if present)")
    dtype: str = _setting(
        "auto",
        "auto | float32 | bfloat16 | float16 (auto: on CPU fp32, or bf16 for a bf16 checkpoint the native "
        "forward serves; bf16 on CUDA when supported)",
    )
    gpu_memory_fraction: float = _setting(0.9, "share of GPU memory the weights may plan to use")
    memory_headroom: float = _setting(0.8, "share of available RAM the weights may plan to use")
    max_body_bytes: int = _setting(1_000_000, "request body limit; 413 beyond")
    log_level: str = _setting("info", "debug | info | warning | error; logs are JSON lines on stderr")
    max_batch_size: int = _setting(32, "rows decoded together; 1 turns batching off")
    max_batch_tokens: int = _setting(4096, "padded prompt tokens admitted for prefill in one step")
    prefill_chunk_tokens: int = _setting(
        256,
        "prompt tokens prefilled per engine step: a longer prompt joins over "
        "several steps while running streams keep decoding (native forward)",
    )
    kv_cache_mb: int = _setting(
        0,
        "static KV cache budget in MiB (native forward); 0 = max_batch_size rows of the "
        "full context. Fewer rows fit: the batch size is lowered to match, and logged",
    )
    weight_formats: str = _setting(
        "auto",
        "auto | float32 | bfloat16 | float32-packed | bfloat16-packed | int8 | int4: auto "
        "measures at start-up at which step sizes bf16 weights beat fp32 on "
        "this CPU, and from which size oneDNN-packed copies of them multiply "
        "faster, and keeps the copies the plan uses (a second format must save "
        "5% and 0.5 ms a step: on the demo model none does); int8 adds "
        "group-quantised int8 weights for one-token steps (batch-1 decode) on "
        "top of auto's plan, if they are faster here (lossy: `aieng eval --dtype "
        "int8` records the accuracy); int4 the same with 4-bit weights in groups "
        "of 32 and the step's input rounded to int8 (`aieng eval --dtype int4`); "
        "the others fix one format",
    )
    decode_attention: str = _setting(
        "auto",
        "auto | sdpa: auto decodes on the CPU with aieng's attention kernel (built "
        "once with the C++ compiler torch.compile uses, cached beside its "
        "cache) and uses PyTorch's scaled_dot_product_attention where it cannot "
        "be built; sdpa always uses PyTorch's",
    )
    kv_cache_dtype: str = _setting(
        "auto",
        "auto | model | bfloat16: the static KV cache's dtype. auto = bf16 where the "
        "one-row step streams bf16 weights (measured, AIENG_WEIGHT_FORMATS) and "
        "aieng's CPU attention kernel reads the cache, else the activations' (fp32 on CPU). "
        "bf16 halves a row's memory and a long-context step's reads; "
        "`aieng eval --kv-cache-dtype bfloat16` records its accuracy",
    )
    prefix_cache: bool = _setting(
        True,
        "prefix caching (native forward): the KV cache rows no request holds keep what their last "
        "request held, and a new prompt starting with the same tokens (a shared system prompt, the "
        "conversation so far) reuses them instead of prefilling them again; the least recently used "
        "is evicted when a row is needed. Within the KV cache budget; 0 = off",
    )
    native: bool = _setting(
        True,
        "the native forward for Llama-family models (static KV cache, chunked prefill, "
        "a compiled decoder layer); 0 = transformers' forward for every model",
    )
    max_queue: int = _setting(256, "waiting requests before 429 with Retry-After")
    max_connections: int = _setting(
        1000, "concurrent connections (or requests) per worker; beyond it a 503 before the request is read; 0 = no cap"
    )
    header_timeout_s: float = _setting(
        10.0,
        "a connection whose request headers are not complete this long after "
        "it opened (or after its last response) gets 408 and is closed",
    )
    body_timeout_s: float = _setting(30.0, "a request body not complete this long after the request began: 408")
    stream_buffer_events: int = _setting(
        1024,
        "tokens a stream may have generated but not yet handed to a slow "
        "client; past it the request is cancelled and logged (slow_client)",
    )
    max_queue_delay_ms: float = _setting(
        0.0,
        "an idle engine waits this long for more requests before a prefill; 0 admits at once "
        "(as vLLM, TGI and Triton do); a few ms batch a burst's prefills at the cost of every lone request's TTFT",
    )
    request_timeout_s: float = _setting(300.0, "deadline of requests without a `timeout` field (504 after it)")
    max_requests: int = _setting(
        10000,
        "a worker retires after about this many requests (jitter 10%), without "
        "losing one: its connections close on their next response; 0 = never",
    )
    max_worker_memory_mb: int = _setting(
        0,
        "a worker whose resident memory passes this retires the same lossless "
        "way (gunicorn starts a fresh one); 0 = no limit",
    )
    slo_e2e_p99_s: float = _setting(
        30.0,
        "end-to-end p99 latency objective of generation requests, seconds; exported as "
        "aieng_slo_e2e_p99_seconds, which the AiengE2ELatencyP99High alert compares with: set your service's",
    )
    graceful_timeout_s: int = _setting(30, "after SIGTERM, in-flight requests get this long to finish")
    canary_kv_share: float = _setting(
        0.2,
        "on a GPU, with hot swaps on: share of the measured KV budget kept for a canary's own KV cache "
        "(a canary runs beside the stable version; a swap's successor reuses the stable cache); 0 = no canary",
    )
    worker_timeout_s: int = _setting(
        120, "a serving worker that stops heart-beating this long is killed and replaced (gunicorn's timeout)"
    )
    worker_start_timeout_s: float = _setting(
        1800.0,
        "a worker's start (on CUDA: verify and load the weights, then the engine) may take this long; "
        "it heart-beats meanwhile, then a start still running is killed after worker_timeout_s",
    )
    step_timeout_s: float = _setting(
        120.0,
        "an engine step running longer marks the worker unready (503 `stuck`), "
        "logs the step's shape and restarts the worker; 0 = no watchdog",
    )
    drain_delay_s: float = _setting(1.0, "after SIGTERM, /health/ready is 503 this long before the listener closes")
    compile: bool = _setting(
        True,
        "torch.compile the decoder layer (other models: the whole forward) at warm-up "
        "(0 = eager, fast start); "
        "`aieng bench engine` measures the gain, notebook 03 the cost",
    )
    compile_budget_s: float = _setting(
        15.0,
        "warm-up waits at most this long for compilation, then the server is "
        "ready and serves eagerly until the compiled graphs are built",
    )
    compile_cache_dir: Path = _setting(
        lambda: user_cache_dir() / "compile-cache",
        "torch.compile's on-disk caches (inductor, FX graph, AOTAutograd), kept "
        "across restarts so a restart reuses the compiled kernels, and shared by every "
        "checkout and working directory of this user ($XDG_CACHE_HOME/aieng/compile-cache "
        "where that is set); TORCHINDUCTOR_CACHE_DIR, when set, wins",
        shown="~/.cache/aieng/compile-cache",
    )
    int8: bool = _setting(
        False,
        "int8 dynamic quantization of Linear layers, CPU only; "
        "`aieng bench engine --int8` and `aieng eval N --int8` measure it",
    )
    oom_degrade: bool = _setting(
        False,
        "a request that runs out of memory alone after generating some tokens ends "
        "with them (finish_reason length, aieng_oom_degraded_total) instead of a "
        "503; a prompt that does not fit alone still fails",
    )
    metrics: bool = _setting(True, "record Prometheus metrics at /metrics (0 only to measure their cost)")
    log_step_every: int = _setting(
        50, "at AIENG_LOG_LEVEL=debug, one engine_step line (rows, tokens, KV rows, step ms) every N steps"
    )
    log_payload_sample: float = _setting(
        0.0, "share of requests whose prompt and output are logged, in [0, 1]", kind="rate"
    )
    guard_checks: str = _setting(
        "empty,repetition",
        "output guard checks on unconstrained answers, comma-separated: "
        "empty, repetition, json, blocklist, hook; empty = no guard",
    )
    guard_action: str = _setting(
        "flag",
        "flag (pass the answer on, marked with X-Output-Guard and a guard field) | "
        "fallback (replace it with AIENG_GUARD_FALLBACK, finish_reason content_filter)",
    )
    guard_max_repeats: int = _setting(
        8,
        "the repetition check fires when the answer ends in one piece of text "
        "repeated this many times (24 characters at least)",
    )
    guard_json_prompts: str = _setting(
        "", "the json check: a regex on the prompt; answers to matching prompts must parse as JSON"
    )
    guard_blocklist: str = _setting(
        "", "the blocklist check: a file of words or phrases, one per line (case-insensitive, whole words)"
    )
    guard_hook: str = _setting(
        "",
        "the hook check: module:function called with (prompt, text), returning a reason to refuse the answer or None",
    )
    guard_fallback: str = _setting(
        "I could not produce a reliable answer to that. Please rephrase or try again.",
        "the reply that replaces a caught answer when AIENG_GUARD_ACTION=fallback",
    )
    capture_dir: str = _setting(
        "",
        "opt-in capture of requests as evidence and for `aieng loadtest --replay`: a directory of "
        "JSONL files, one per worker (capture-<pid>.jsonl), written off the event loop; empty = "
        "capture off. Prompts and outputs land on disk: read docs/operations.md (capture) first",
    )
    capture_sample: float = _setting(
        0.0,
        "with capture on, the share of ordinary requests kept, in [0, 1]; guard-flagged and 5xx ones are always kept",
        kind="rate",
    )
    capture_max_bytes: int = _setting(
        64 * 2**20, "a capture file's size in bytes before it rotates (at least 1024)", shown="67108864 (64 MiB)"
    )
    capture_max_files: int = _setting(
        5,
        "rotated capture files each worker keeps (at least 1; the oldest is deleted, and so are those "
        "of gone workers past this many): with AIENG_CAPTURE_MAX_BYTES, what bounds capture's disk",
    )
    capture_redact: str = _setting(
        "",
        "module:function called with each captured record (a dict) before it is written, returning "
        "the record to write (edit messages, prompt, output) or None to drop it; one that raises "
        "drops the record (aieng_capture_dropped_total); checked at start",
    )
    admin_token: str = field(
        default="",
        repr=False,
        metadata={  # a secret: never in a repr or a log line
            "help": "bearer token of the admin routes (POST /admin/reload, GET /admin/status); "
            "empty = the routes do not exist",
            "shown": "(empty)",
        },
    )
    reload_poll_s: float = _setting(
        1.0,
        "each worker checks the store's `current` this often and hot-swaps to it "
        "when it changed (N alone in AIENG_MODEL; N@V pins); 0 = only on "
        "POST /admin/reload",
    )
    test_start_delay_s: float = _setting(
        0.0, "tests only: each worker sleeps this long as its start begins (a slow model load)"
    )
    test_step_delay: str = _setting(
        "",
        "tests only: VERSION=SECONDS[,...] sleeps that long after every engine step "
        "of those versions (a correct but slow version for the canary tests)",
    )

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        """Defaults, then ``AIENG_<FIELD>`` variables, then non-None ``overrides`` (CLI flags)."""
        values: dict = {}
        for f in fields(cls):
            raw = os.environ.get(env_name(f.name))
            if raw not in (None, ""):
                values[f.name] = _coerce(f.name, raw)
        settings = cls(**values)
        clean = {k: (_coerce(k, v) if isinstance(v, str) else v) for k, v in overrides.items() if v is not None}
        return replace(settings, **clean)


#: The defaults, and nothing else (no environment): where every component config takes its own.
#: ``EngineConfig()``, ``SchedulerConfig()`` and ``LoadConfig()`` are what ``aieng serve`` builds
#: when nothing is set, so a notebook, a benchmark or a test that builds one gets the served engine.
DEFAULTS = Settings()


def env_name(name: str) -> str:
    return f"AIENG_{name.upper()}"


def default_text(f) -> str:
    if "shown" in f.metadata:
        return f.metadata["shown"]
    value = f.default
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def settings_help() -> str:
    """The settings block of ``aieng serve --help``: variable, default, meaning."""
    import textwrap

    lines = []
    for f in fields(Settings):
        text = f"{f.metadata['help']} [{default_text(f)}]"
        lines += textwrap.wrap(text, width=100, initial_indent=f"  {env_name(f.name):26} ", subsequent_indent=" " * 29)
    return "\n".join(lines)


def settings_markdown_table() -> str:
    """The settings table of docs/reference.md."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for f in fields(Settings):
        meaning = f.metadata["help"].replace("|", "\\|")  # a | in the text is not a column
        rows.append(f"| `{env_name(f.name)}` | `{default_text(f)}` | {meaning} |")
    return "\n".join(rows)


def _coerce(name: str, raw: str):
    f = next(f for f in fields(Settings) if f.name == name)
    kind = _rate if f.metadata.get("kind") == "rate" else typing.get_type_hints(Settings)[name]
    kind = _flag if kind is bool else kind
    try:
        return kind(raw)
    except ValueError as exc:
        from aieng.errors import ConfigError

        raise ConfigError(f"{env_name(name)}={raw!r} is not a valid {kind.__name__.strip('_')}") from exc


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _rate(raw: str) -> float:
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(raw)
    return value


if __name__ == "__main__":
    print(settings_markdown_table())
