"""``aieng loadtest``: production-shaped load against a running server, checks, capacity plan, report."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "loadtest",
        help="production-shaped load (request mix, arrivals, SLOs) against any OpenAI-compatible server",
        description="Send a workload's request mix (default: the source article's 20/50/30 short/medium/long on the "
        "demo model) to a running server with closed-loop users or open-loop constant/Poisson/bursty "
        "arrivals, or sweep rates up to saturation. Reports TTFT, ITL, TPOT and end-to-end percentiles "
        "per class, errors by status, goodput under --slo limits, then checks the server (RSS growth, "
        "its /metrics agree with the client, nothing left running, error rate) and, after a sweep, "
        "plans capacity. --replay sends a capture's requests (AIENG_CAPTURE_DIR) with their timing instead. "
        "Writes results.json, requests.jsonl, PNG plots and report.html to --out. "
        "Exit 0: every check passed; 3: a check failed. Format of workload files: docs/loadtest.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--url",
        required=True,
        help="the server, e.g. http://127.0.0.1:8000 (it should serve nothing "
        "else during the test: the checks compare its counters with ours)",
    )
    p.add_argument("--workload", default="default", help="a built-in workload (default, big) or a YAML/TOML file")
    p.add_argument("--out", type=Path, required=True, help="directory for results.json, the plots and report.html")
    p.add_argument("--rate-sweep", action="store_true", help="open-loop levels at rising rates until saturation")
    p.add_argument(
        "--replay",
        nargs="+",
        action="extend",
        metavar="FILE",
        help="instead of a workload, send the requests of a capture (AIENG_CAPTURE_DIR's JSONL files, or "
        "that directory) at their recorded arrival times: same route, messages or prompt and sampling fields",
    )
    p.add_argument(
        "--replay-speed",
        type=float,
        default=1.0,
        help="with --replay: play the captured timing this many times faster (2: twice the rate)",
    )
    p.add_argument(
        "--slo",
        action="append",
        metavar="NAME=SECONDS",
        help="a per-request limit for goodput: ttft, itl (the request's p95 gap), tpot or e2e; repeat "
        "for several (default: ttft=1 itl=0.1)",
    )
    p.add_argument(
        "--process", choices=["closed", "constant", "poisson", "bursty"], help="override the arrival process"
    )
    p.add_argument("--rate", type=float, help="override the open-loop rate, requests/s")
    p.add_argument("--users", type=int, help="override the closed-loop users")
    p.add_argument("--think", type=float, help="override the closed-loop mean think time, seconds")
    p.add_argument("--duration", type=float, help="override duration_s (and, with --rate-sweep, each level's)")
    p.add_argument("--max-requests", type=int, help="override max_requests")
    p.add_argument("--model", help="override the model name sent in each request")
    p.add_argument(
        "--server-kind",
        default="aieng",
        choices=["aieng", "transformers", "llama.cpp", "openai"],
        help="how requests ask for exactly max_tokens (exact_tokens classes): each server has its own way",
    )
    p.add_argument(
        "--honour-retry-after",
        action="store_true",
        help="retry a 429 after its Retry-After (up to 3 times; the wait counts in its latency) instead "
        "of counting it as failed",
    )
    p.add_argument("--target-rps", type=float, help="capacity plan: replicas needed for this rate (with --rate-sweep)")
    p.add_argument("--headroom", type=float, default=0.2, help="capacity plan: spare share on top of --target-rps")
    p.add_argument(
        "--pid",
        type=int,
        help="read the server's resident memory from this process tree (for a server without aieng's metrics)",
    )
    p.add_argument("--max-error-rate", type=float, default=0.01, help="the error_rate check's limit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_loadtest)


def _loadtest(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from aieng.loadtest.checks import CheckLimits
    from aieng.loadtest.run import LoadTest, run_loadtest
    from aieng.loadtest.workload import load_workload

    replay = _replay(args) if args.replay else None
    workload = replay.workload if replay is not None else load_workload(args.workload)
    arrival = {
        k: v
        for k, v in (("process", args.process), ("rate", args.rate), ("users", args.users), ("think_s", args.think))
        if v is not None
    }
    if arrival:
        workload = workload.with_arrival(**arrival)
    if args.duration is not None:
        workload = replace(
            workload,
            duration_s=args.duration,
            sweep=replace(workload.sweep, duration_s=args.duration),
            warmup_s=min(workload.warmup_s, args.duration / 4),
            cooldown_s=min(workload.cooldown_s, args.duration / 8),
        )
    if args.max_requests is not None and replay is None:
        workload = replace(workload, max_requests=args.max_requests)
    if args.model and replay is None:
        workload = replace(workload, model=args.model)
    try:
        from aieng.loadtest.summary import parse_slos

        slos = parse_slos(args.slo)
    except ValueError as exc:
        raise SystemExit(f"aieng loadtest: {exc}") from None
    test = LoadTest(
        url=args.url,
        workload=workload,
        out=args.out,
        sweep=args.rate_sweep,
        slos=slos,
        server_kind=args.server_kind,
        honour_retry_after=args.honour_retry_after,
        pid=args.pid,
        target_rps=args.target_rps,
        headroom=args.headroom,
        limits=CheckLimits(max_error_rate=args.max_error_rate),
        progress=not args.no_progress,
        replay=replay,
    )
    data = run_loadtest(test)
    return 0 if data["passed"] else 3


def _replay(args: argparse.Namespace):
    """The capture to replay; the flags that shape a workload's arrivals have no meaning for it."""
    from aieng.loadtest.replay import load_replay

    clashing = [
        flag
        for flag, value in (
            ("--rate-sweep", args.rate_sweep),
            ("--process", args.process),
            ("--rate", args.rate),
            ("--users", args.users),
            ("--think", args.think),
            ("--duration", args.duration),
        )
        if value
    ]
    if clashing:
        raise SystemExit(
            f"aieng loadtest: --replay takes its requests and their timing from the capture; drop {', '.join(clashing)}"
            " (--replay-speed changes the pace)"
        )
    return load_replay(args.replay, speed=args.replay_speed, model=args.model, max_requests=args.max_requests)
