"""``aieng serve``: the packaged server."""

from __future__ import annotations

import argparse

from aieng.cli.common import store_option_parent, settings_from


STORE = store_option_parent()


def add_parser(sub) -> None:
    p = sub.add_parser("serve", parents=[STORE], help="serve the store's current model over an OpenAI-compatible HTTP API",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Verify, load and warm up the model, then serve it.\n\n"
                    "Settings (environment variable, overridden by the flag):\n"
                    "  AIENG_STORE   model store root (default ./var/store)\n"
                    "  AIENG_MODEL   N or N@V to serve (default demo, i.e. demo's current version)\n"
                    "  AIENG_HOST    bind address (default 127.0.0.1)\n"
                    "  AIENG_PORT    port (default 8000)\n"
                    "  AIENG_DEVICE  auto | cpu | cuda | cuda:N (default auto: CUDA if present)\n"
                    "  AIENG_DTYPE   auto | float32 | bfloat16 | float16 (auto: fp32 on CPU, bf16 on CUDA)\n"
                    "  AIENG_MEMORY_HEADROOM       share of available RAM the weights may use (0.8)\n"
                    "  AIENG_GPU_MEMORY_FRACTION   share of GPU memory the weights may use (0.9)\n"
                    "  AIENG_MAX_BODY_BYTES        request body limit, 413 beyond (1000000)\n\n"
                    "A version that fails hash verification is never served: the command exits 1 naming the files.",
    )
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--model", default=None, metavar="N[@V]")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from aieng.server.run import serve

    serve(settings_from(args, host=args.host, port=args.port, model=args.model, device=args.device, dtype=args.dtype))
    return 0
