"""``aieng serve``: the packaged server (gunicorn master + uvicorn workers)."""

from __future__ import annotations

import argparse

from aieng.cli.common import settings_from, store_option_parent
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
/health/ready says 503. --no-compile for fast starts. A model torch.compile cannot handle falls
back to eager with a warning. `aieng bench engine` measures compiled against eager.

--workers auto:
  CUDA: one worker per GPU (a CUDA context per process; batching inside one process uses the
  GPU better). CPU: workers = min(cores // 2, memory fit) where memory fit =
  (available RAM - weights) // (per-worker overhead + KV cache at max batch); weights count once
  because preload shares them. Torch threads per worker on CPU = cores // workers - 1 (at
  least 1): workers x threads <= cores, and each worker keeps a core for its event loop.
  aieng.server.process.worker_plan has the rules and why; notebook 01 shows this host's plan.

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
