"""``aieng release ...``: act on a running service after a release."""

from __future__ import annotations

import argparse

from aieng.cli.common import store_from, store_option_parent
from aieng.cli.model_cmds import add_gate_options, gate_overrides

STORE = store_option_parent()


def add_parser(sub) -> None:
    release = sub.add_parser(
        "release",
        help="watch a release on a running server and roll back on its own",
        description="Release operations against a running aieng server.",
    )
    verbs = release.add_subparsers(dest="verb", metavar="VERB", required=True)
    p = verbs.add_parser(
        "watch",
        parents=[STORE],
        help="judge the live metrics after a swap; roll back if they degrade",
        description="Scrape URL/metrics every --interval seconds and apply the rollback decision "
        "(aieng/release/decision.py) to what the server did since the watch began: "
        "error rate, early-EOS rate, p99 latency and TTFT against the version's "
        "performance baseline (or the previous version's), throughput at comparable "
        "load. On `rollback` it rolls the store back and hot-swaps the server "
        "($AIENG_ADMIN_TOKEN); on `promote` (healthy for --window) it records the "
        "confirmation. Every outcome goes to history.jsonl. Exit 0 when the version "
        "held, 3 when it was rolled back, 4 when still undecided at --max-wait.",
    )
    p.add_argument("name")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--window", type=float, default=60.0, help="seconds the version must stay healthy (default 60)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between checks (default 5)")
    p.add_argument(
        "--max-wait", type=float, default=None, help="give up undecided after this long (default 3 x window)"
    )
    p.add_argument(
        "--min-requests", type=int, default=None, help="requests needed before latency is judged (default 20)"
    )
    p.add_argument("--max-error-rate", type=float, default=None, help="default 0.05")
    p.add_argument("--max-latency-ratio", type=float, default=None, help="p99 vs baseline (default 2)")
    p.add_argument("--max-early-eos-rate", type=float, default=None, help="default 0.15")
    p.add_argument(
        "--min-probe-agreement",
        type=float,
        default=None,
        help="a suite without assertions: share of probe answers that must equal the replaced version's "
        "served answers (default 0.8)",
    )
    p.add_argument(
        "--no-probe",
        action="store_true",
        help="skip the live quality probe (held-out prompts per family asked of the server first)",
    )
    p.set_defaults(handler=_watch)

    p = verbs.add_parser(
        "record-answers",
        parents=[STORE],
        help="keep the served version's probe answers, for the watchdog of the next release",
        description="Ask the server the probe sample of a suite for NAME's current version (pinned) and "
        "record the answers in that version's manifest (served_answers). Run it before swapping to a "
        "version whose suite has no assertions: after the swap the watchdog holds the new version's "
        "answers to these (a canary's shadow probe records them on its own). Idempotent.",
    )
    p.add_argument("name")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--for",
        dest="for_version",
        metavar="VERSION",
        default=None,
        help="ask the probe sample of this version's suite (the one about to be released); default: "
        "the current version's own suite",
    )
    p.set_defaults(handler=_record_answers)

    p = verbs.add_parser(
        "canary",
        parents=[STORE],
        help="shift traffic to VERSION step by step; promote or roll back",
        description="Canary release on a running server (admin token in $AIENG_ADMIN_TOKEN): the "
        "release gate, then a shadow quality probe of both versions, then for each "
        "--steps percentage the canary gets that share of unpinned traffic and is "
        "checked every --interval seconds against the stable version on the same "
        "traffic: success rate, p99 latency and TTFT as ratios to stable, early-EOS "
        "rate (aieng/release/canary_rollout.py). --max-failed-checks failed checks roll it back "
        "(the canary is unloaded); all steps passed promote it to current. Every step "
        "and the outcome go to history.jsonl. Exit 0 promoted, 1 refused by the gate, "
        "3 rolled back, 5 held (a step never saw --min-step-requests). With --abort: return all "
        "traffic to the stable version now (the canary "
        "record is cleared, every worker at --url unloads it); a second abort does nothing.",
    )
    p.add_argument("name")
    p.add_argument("version", nargs="?", help="the version to release (not with --abort)")
    p.add_argument("--url", help="the server, e.g. http://127.0.0.1:8000 (needed to release; with --abort, optional)")
    p.add_argument(
        "--abort", action="store_true", help="stop the canary in progress: all traffic back to stable; needs --reason"
    )
    p.add_argument("--reason", default="", help="why the canary is aborted (recorded in history.jsonl)")
    p.add_argument("--steps", default="1,10,50,100", help="traffic percentages, in order (default 1,10,50,100)")
    p.add_argument("--interval", default="60s", help="seconds per check, e.g. 60s or 2m (default 60s)")
    p.add_argument("--max-failed-checks", type=int, default=2, help="failed checks before rolling back (default 2)")
    p.add_argument(
        "--min-step-requests",
        type=int,
        default=100,
        help="canary requests a step needs before it may pass (default 100; a quiet service lowers it)",
    )
    p.add_argument("--min-step-time", default="0s", help="and this long at the step's weight (default 0s)")
    p.add_argument(
        "--max-step-wait",
        default=None,
        help="a step without enough requests this long ends by --on-thin-traffic (default 10 intervals)",
    )
    p.add_argument(
        "--on-thin-traffic",
        choices=["hold", "rollback", "promote"],
        default="hold",
        help="hold: stop there, the canary kept at its weight (exit 5); rollback; promote: pass the step "
        "anyway, said in the log (default hold)",
    )
    p.add_argument("--min-success-rate", type=float, default=None, help="default 0.99")
    p.add_argument("--max-latency-ratio", type=float, default=None, help="canary p99 / stable p99 (default 1.5)")
    p.add_argument("--max-ttft-ratio", type=float, default=None, help="default 1.5")
    p.add_argument("--no-probe", action="store_true", help="skip the shadow quality probe")
    p.add_argument(
        "--prometheus",
        metavar="URL",
        default=None,
        help="read the checks from this Prometheus (e.g. http://127.0.0.1:9090) instead of the server's "
        "/metrics; the PromQL asked is printed in the log",
    )
    p.add_argument(
        "--prometheus-selector",
        default="",
        metavar="MATCHERS",
        help="label matchers added to every query, e.g. 'job=\"aieng\"' when Prometheus scrapes more than this service",
    )
    add_gate_options(p)
    p.set_defaults(handler=_canary)


def _watch(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from aieng.release.decision import PROMOTE, RollbackThresholds
    from aieng.release.watch import watch

    overrides = {
        "window_s": args.window,
        "min_requests": args.min_requests,
        "max_error_rate": args.max_error_rate,
        "max_latency_ratio": args.max_latency_ratio,
        "max_early_eos_rate": args.max_early_eos_rate,
        "min_probe_agreement": args.min_probe_agreement,
    }
    thresholds = replace(RollbackThresholds(), **{k: v for k, v in overrides.items() if v is not None})
    result = watch(
        store_from(args),
        args.name,
        args.url,
        thresholds=thresholds,
        interval_s=args.interval,
        max_wait_s=args.max_wait,
        probe=not args.no_probe,
    )
    if result.rolled_back_to:
        print(f"rolled back {args.name}@{result.version} -> {result.rolled_back_to}: {result.decision.reason}")
        return 3
    if result.decision.action == PROMOTE:
        print(f"{args.name}@{result.version} held for its window: {result.decision.reason}")
        return 0
    print(f"{args.name}@{result.version} undecided: {result.decision.reason}")
    return 4


def _record_answers(args: argparse.Namespace) -> int:
    from aieng.release.served_answers import ask_and_record
    from aieng.store import ModelRef

    store = store_from(args)
    suite = store.suite(ModelRef(args.name, args.for_version)) if args.for_version else None
    if args.for_version and suite is None:
        raise SystemExit(f"{args.name}@{args.for_version} has no eval suite registered: nothing to ask")
    try:
        kept, version = ask_and_record(store, args.name, args.url, suite=suite, by="aieng release record-answers")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    print(f"recorded the probe answers {args.url} served for {args.name}@{version} ({kept} kept)")
    return 0


def _seconds(text: str, flag: str = "--interval") -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip().lower()
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise SystemExit(f"{flag} {text!r}: give seconds, e.g. 60, 60s or 2m") from None


def _canary(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from aieng.errors import ConfigError
    from aieng.release.canary_rollout import CanaryThresholds, StepEvidence, abort_canary, run_canary
    from aieng.release.promotion import thresholds_for
    from aieng.release.sources import PrometheusMetrics

    if args.abort:
        if args.version:
            raise ConfigError(f"--abort takes no version: it aborts whichever canary {args.name} has")
        abort_canary(store_from(args), args.name, args.reason, url=args.url)
        return 0
    if not args.version or not args.url:
        raise ConfigError(
            "give the version and the server: aieng release canary NAME VERSION --url URL "
            "(or stop one in progress: aieng release canary NAME --abort --reason WHY)"
        )

    try:
        steps = [int(step) for step in args.steps.split(",")]
    except ValueError:
        raise SystemExit(f"--steps {args.steps!r}: give percentages, e.g. 1,10,50,100") from None
    if not steps or steps != sorted(steps) or not 0 < steps[0] or steps[-1] != 100:
        raise SystemExit(f"--steps {args.steps!r}: rising percentages between 1 and 100, ending at 100")
    overrides = {
        "min_success_rate": args.min_success_rate,
        "max_latency_ratio": args.max_latency_ratio,
        "max_ttft_ratio": args.max_ttft_ratio,
    }
    thresholds = replace(CanaryThresholds(), **{k: v for k, v in overrides.items() if v is not None})
    evidence = StepEvidence(
        min_requests=args.min_step_requests,
        min_seconds=_seconds(args.min_step_time, "--min-step-time"),
        max_wait_s=_seconds(args.max_step_wait, "--max-step-wait") if args.max_step_wait else None,
        on_timeout=args.on_thin_traffic,
    )
    store = store_from(args)
    result = run_canary(
        store,
        args.name,
        args.version,
        args.url,
        steps=steps,
        interval_s=_seconds(args.interval),
        max_failed_checks=args.max_failed_checks,
        thresholds=thresholds,
        evidence=evidence,
        probe=not args.no_probe,
        gate=thresholds_for(store, args.name, args.version, gate_overrides(args)),
        metrics=PrometheusMetrics(args.prometheus, args.prometheus_selector) if args.prometheus else None,
    )
    return {"promoted": 0, "refused": 1, "rolled_back": 3, "held": 5}[result.outcome]
