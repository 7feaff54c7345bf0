"""``aieng serve``: the packaged server (gunicorn master + uvicorn workers)."""

from __future__ import annotations

import argparse

from aieng.cli.common import settings_from, store_option_parent
from aieng.server.process.worker_plan import COMPUTE_BOUND_WEIGHT_BYTES
from aieng.settings import settings_help

STORE = store_option_parent()

DESCRIPTION = f"""\
Verify, load and serve a model over an OpenAI-compatible HTTP API: a gunicorn master that loads
the weights once (preload) and forks uvicorn workers that share them; each worker runs the
continuous-batching engine in its own thread and warms up before /health/ready turns 200.

Settings (environment variable, overridden by the flag of the same name; default in brackets):
{settings_help()}

--compile (the default): warm-up compiles prefill and decode, from seconds (inductor's cache warm)
to minutes (cold, or a large model); with one torch thread per worker it happens once, in the
master before fork, and the workers share the result; otherwise each worker compiles while
/health/ready says 503 with the phase. --no-compile for fast starts. A model torch.compile cannot
handle falls back to eager with a warning. `aieng bench engine` measures compiled against eager.
The compiled kernels and graphs are cached in --compile-cache-dir, which survives restarts.

Start-up is logged from the first second: each phase (import, verify, load, warmup, workers,
engine, ready) starts and ends with a JSON line, each warm-up shape gets one, and a heartbeat says
"still <phase> <detail> after N s" every 5 s of silence; /health/ready's 503 body names the phase.

--workers auto:
  CUDA: one worker per GPU (a CUDA context per process; batching inside one process uses the
  GPU better). CPU: workers = min(cores // 2, memory fit) where memory fit =
  (available RAM - weights) // (per-worker overhead + KV cache at max batch); weights count once
  because preload shares them. Torch threads per CPU worker follow what dominates its time per
  token: from {COMPUTE_BOUND_WEIGHT_BYTES // 2**20} MiB of weights up, matrix multiplies, so it gets cores // workers;
  below, the Python streaming each token, so it gets cores // workers - 1 (at least 1) and keeps
  a core for its event loop. The worker_plan log line says which and why. On a host shared with
  other CPU work, one thread per worker can be faster: measure with --torch-threads.
  aieng.server.process.worker_plan has the rules and why; notebook 01 shows this host's plan.

A version that fails hash verification is never served: the command exits 1 naming the files."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        parents=[STORE],
        help="serve a model over an OpenAI-compatible HTTP API",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=DESCRIPTION,
    )
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--model", default=None, metavar="N[@V]")
    p.add_argument("--workers", default=None, metavar="auto|N")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads per worker (default 0 = the worker plan: see --workers auto below)",
    )
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-batch-size", type=int, default=None)
    p.add_argument("--max-batch-tokens", type=int, default=None)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--max-queue-delay-ms", type=float, default=None)
    p.add_argument("--request-timeout", type=float, default=None, dest="request_timeout_s", metavar="SECONDS")
    p.add_argument("--graceful-timeout", type=int, default=None, dest="graceful_timeout_s", metavar="SECONDS")
    p.add_argument("--drain-delay", type=float, default=None, dest="drain_delay_s", metavar="SECONDS")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile prefill and decode during warm-up (default on; --no-compile = eager)",
    )
    p.add_argument(
        "--compile-cache-dir",
        default=None,
        metavar="DIR",
        help="torch.compile's on-disk caches, kept across restarts (default ~/.cache/aieng/compile-cache)",
    )
    p.add_argument(
        "--int8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="int8 dynamic quantization of Linear layers (CPU; default off)",
    )
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from aieng.observability.prom import prepare_multiprocess_dir

    prepare_multiprocess_dir()  # before anything imports prometheus_client
    from aieng.observability.logs import configure_logging
    from aieng.server.process.startup import StartupProgress

    keys = (
        "host",
        "port",
        "model",
        "workers",
        "torch_threads",
        "device",
        "dtype",
        "max_batch_size",
        "max_batch_tokens",
        "max_queue",
        "max_queue_delay_ms",
        "request_timeout_s",
        "graceful_timeout_s",
        "drain_delay_s",
        "compile",
        "compile_cache_dir",
        "int8",
    )
    settings = settings_from(args, **{k: getattr(args, k) for k in keys})
    configure_logging(settings.log_level)
    progress = StartupProgress()  # logged from the first second: importing torch alone takes seconds
    progress.begin("import", "torch, transformers and the server")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr carries JSON lines only
    hf_logging.disable_default_handler()  # transformers' warnings (a prompt past the model's length) too:
    hf_logging.enable_propagation()  # through the JSON handler, not its own "[transformers] ..." lines
    from aieng.server.process.serve import serve

    serve(settings, progress)
    return 0
