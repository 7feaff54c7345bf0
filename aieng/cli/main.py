"""``aieng``: parse, dispatch, and turn every AiengError into one line on stderr and a non-zero exit.

Heavy imports (torch, transformers) happen inside the command handlers so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys

from aieng import __version__
from aieng.cli import bench_cmds, demo_cmds, eval_cmd, loadtest_cmd, model_cmds, release_cmds, serve_cmd, triage_cmd
from aieng.errors import AiengError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aieng",
        description="Serve a language model the way production demands: verified store, engine, server, benchmarks.",
        epilog="Settings come from AIENG_* environment variables (AIENG_STORE, AIENG_MODEL, ...); flags override them.",
    )
    parser.add_argument("--version", action="version", version=f"aieng {__version__}")
    parser.add_argument("--store", default=None, help="model store root (default: $AIENG_STORE or ./var/store)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo_cmds.add_parser(sub)
    model_cmds.add_parser(sub)
    eval_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    bench_cmds.add_parser(sub)
    release_cmds.add_parser(sub)
    loadtest_cmd.add_parser(sub)
    triage_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per HTTP call drowns what the command says
    try:
        return int(args.handler(args) or 0)
    except AiengError as exc:
        print(f"aieng: error: {exc.message}", file=sys.stderr)
        return 1
    except FileExistsError as exc:
        print(f"aieng: error: {exc}", file=sys.stderr)
        return 1
    except TimeoutError as exc:  # an OSError, but no traceback: it is a state of the world, not a bug
        print(f"aieng: error: timed out: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # Every writer stages into a temporary folder that is removed on failure, so nothing half-written stays.
        print(
            f"aieng: error: no space left on device while writing {exc.filename or 'a file'}; nothing partial "
            "was kept. Free space (df -h), or point --store / --out at a larger disk, and run the command again",
            file=sys.stderr,
        )
        return 1
    except Exception as exc:
        if not _http_failure(exc):
            raise
        print(f"aieng: error: {_http_message(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aieng: interrupted", file=sys.stderr)
        return 130


def _http_failure(exc: BaseException) -> bool:
    """A server that is down, slow or says no is a state of the world: one line, not a traceback.
    (httpx is imported only by the commands that talk HTTP; if it is not loaded, it did not fail.)"""
    httpx = sys.modules.get("httpx")
    return httpx is not None and isinstance(exc, httpx.HTTPError)


def _http_message(exc) -> str:
    httpx = sys.modules["httpx"]
    if isinstance(exc, httpx.HTTPStatusError):
        answer = exc.response
        return f"{exc.request.method} {exc.request.url} answered {answer.status_code}: {answer.text[:300]}"
    where = exc.request.url if getattr(exc, "_request", None) is not None else "the server"
    return f"could not talk to {where} ({type(exc).__name__}: {exc}); is the server running there and is --url right?"


if __name__ == "__main__":
    raise SystemExit(main())
