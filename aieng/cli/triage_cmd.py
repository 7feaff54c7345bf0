"""``aieng triage``: the incident triage runbook's diagnosis at a shell, for when an alert fires."""

from __future__ import annotations

import argparse

from aieng.cli.common import settings_from, store_option_parent


def add_parser(sub) -> None:
    p = sub.add_parser(
        "triage",
        parents=[store_option_parent()],
        help="diagnose a running server: health, release state, metrics over a window, what to run next",
        description="Read-only. Probe URL's health routes, read the store's current version, canary and "
        "recent history, take two /metrics snapshots --window seconds apart, and judge them by "
        "the thresholds of the alert rules (deploy/prometheus/alerts.yml, or --alert-rules). A "
        "server that does not answer is a finding, not an error. Prints one row per check with "
        "the action and runbook for each failure. Exit 0: healthy; 3: a check failed; 4: "
        "healthy as far as measured, but some checks had no data. For an incident record, run "
        "runbooks/incident_triage.ipynb with papermill instead: same diagnosis, kept.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    p.add_argument("--window", type=float, default=30.0, help="seconds between the two snapshots (default 30)")
    p.add_argument(
        "--model", default=None, help="model name in the store (default: the server's, else $AIENG_MODEL's name)"
    )
    p.add_argument("--alert-rules", default=None, help="the Prometheus rule file the thresholds come from")
    p.set_defaults(handler=_triage)


def _triage(args: argparse.Namespace) -> int:
    from aieng.observability.alerts import triage_thresholds
    from aieng.observability.triage import FAIL, UNKNOWN, table, triage

    limits = triage_thresholds(args.alert_rules)
    settings = settings_from(args)
    fallback = settings.model.partition("@")[0]
    report = triage(
        args.url, limits, window_s=args.window, store_root=settings.store, name=args.model, fallback=fallback
    )
    print(report.health.summary())
    for line in report.release.lines() if report.release else ():
        print(line)
    print()
    print(table(report.findings))
    print(f"\nverdict: {report.verdict}")
    statuses = {f.status for f in report.findings}
    return 3 if FAIL in statuses else 4 if UNKNOWN in statuses else 0
