"""``aieng serve``: the packaged server (gunicorn master + uvicorn workers)."""

from __future__ import annotations

import argparse

from aieng.cli.common import settings_from, store_option_parent

STORE = store_option_parent()

DESCRIPTION = """\
Verify, load and serve a model over an OpenAI-compatible HTTP API: a gunicorn master that loads
the weights once (preload) and forks uvicorn workers that share them; each worker runs the
continuous-batching engine in its own thread and warms up before /health/ready turns 200.

Settings (environment variable, overridden by the flag):
  AIENG_STORE                model store root (./var/store)
  AIENG_MODEL                N or N@V to serve (demo = demo's current version)
  AIENG_HOST, AIENG_PORT     bind address (127.0.0.1:8000)
  AIENG_WORKERS              auto or a count (auto)
  AIENG_DEVICE               auto | cpu | cuda | cuda:N (auto: CUDA if present)
  AIENG_DTYPE                auto | float32 | bfloat16 | float16 (auto: fp32 on CPU, bf16 on CUDA)
  AIENG_MAX_BATCH_SIZE       rows decoded together; 1 turns batching off (32)
  AIENG_MAX_BATCH_TOKENS     padded prompt tokens prefilled in one step (4096)
  AIENG_MAX_QUEUE            waiting requests before 429 + Retry-After (256)
  AIENG_MAX_QUEUE_DELAY_MS   an idle engine waits this long to prefill a burst together (10)
  AIENG_REQUEST_TIMEOUT_S    deadline of requests without a `timeout` field (300)
  AIENG_GRACEFUL_TIMEOUT_S   after SIGTERM, in-flight requests get this long (30)
  AIENG_DRAIN_DELAY_S        after SIGTERM, /health/ready is 503 this long before the listener closes (1)
  AIENG_MEMORY_HEADROOM      share of available RAM the weights may use (0.8)
  AIENG_GPU_MEMORY_FRACTION  share of GPU memory the weights may use (0.9)
  AIENG_MAX_BODY_BYTES       request body limit, 413 beyond (1000000)
  AIENG_COMPILE              torch.compile prefill and decode during warm-up (1). On the demo
                             model generation ran ~2.1x faster at batch 1 and ~1.8-2.2x at batch
                             32 than eager (`aieng bench engine`, same run). Warm-up takes 10-30 s
                             with inductor's cache warm, a minute or two cold. With one torch
                             thread per worker it happens once, in the master before fork, and
                             the workers share the result; otherwise each worker compiles while
                             /health/ready says 503. --no-compile for fast starts; a model
                             compile cannot handle falls back to eager with a warning.
  AIENG_INT8                 int8 dynamic quantization of Linear layers, CPU only (0). On the demo
                             model: 0.7x eager speed at batch 1, 1.3x at batch 32, no accuracy
                             change (`aieng bench engine --int8`, `aieng eval N --int8`)
  AIENG_TORCH_THREADS        torch threads per worker (0 = the --workers auto rule below)
  AIENG_METRICS              record Prometheus metrics at /metrics (1; 0 only to measure their cost)
  AIENG_LOG_PAYLOAD_SAMPLE   share of requests whose prompt and output are logged, in [0, 1] (0)
  AIENG_LOG_LEVEL            debug | info | warning | error (info); logs are JSON lines on stderr

--workers auto:
  CUDA: one worker per GPU (a CUDA context per process; batching inside one process uses the
  GPU better). CPU: workers = min(cores // 2, memory fit) where memory fit =
  (available RAM - weights) // (per-worker overhead + KV cache at max batch); weights count once
  because preload shares them. Torch threads per worker on CPU = cores // workers - 1 (at
  least 1): workers x threads <= cores, and each worker keeps a core for its event loop.

A version that fails hash verification is never served: the command exits 1 naming the files."""


def add_parser(sub) -> None:
    p = sub.add_parser("serve", parents=[STORE], help="serve a model over an OpenAI-compatible HTTP API",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=DESCRIPTION)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--model", default=None, metavar="N[@V]")
    p.add_argument("--workers", default=None, metavar="auto|N")
    p.add_argument("--torch-threads", type=int, default=None, metavar="N",
                   help="torch threads per worker (default 0 = cores // workers - 1 on CPU, at least 1)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-batch-size", type=int, default=None)
    p.add_argument("--max-batch-tokens", type=int, default=None)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--max-queue-delay-ms", type=float, default=None)
    p.add_argument("--request-timeout", type=float, default=None, dest="request_timeout_s", metavar="SECONDS")
    p.add_argument("--graceful-timeout", type=int, default=None, dest="graceful_timeout_s", metavar="SECONDS")
    p.add_argument("--drain-delay", type=float, default=None, dest="drain_delay_s", metavar="SECONDS")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile prefill and decode during warm-up (default on; --no-compile = eager)")
    p.add_argument("--int8", action=argparse.BooleanOptionalAction, default=None,
                   help="int8 dynamic quantization of Linear layers (CPU; default off)")
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from aieng.observability.prom import prepare_multiprocess_dir

    prepare_multiprocess_dir()  # before anything imports prometheus_client
    from aieng.observability.logs import configure_logging
    from aieng.server.process.serve import serve

    keys = ("host", "port", "model", "workers", "torch_threads", "device", "dtype", "max_batch_size", "max_batch_tokens", "max_queue",
            "max_queue_delay_ms", "request_timeout_s", "graceful_timeout_s", "drain_delay_s", "compile", "int8")
    settings = settings_from(args, **{k: getattr(args, k) for k in keys})
    configure_logging(settings.log_level)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr carries JSON lines only
    serve(settings)
    return 0
