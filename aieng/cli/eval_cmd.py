"""``aieng eval N[@V]``: held-out quality of a store version, written into its manifest."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from aieng.cli.common import store_option_parent, print_json, settings_from


STORE = store_option_parent()


def add_parser(sub) -> None:
    p = sub.add_parser("eval", parents=[STORE], help="held-out exact-match accuracy per task family and perplexity; saved in the manifest",
                       description="Load N (current) or N@V from the store (hash-verified), run the held-out suite, "
                                   "print the metrics and record them in the version's manifest under `eval`.")
    p.add_argument("ref", metavar="N[@V]")
    p.add_argument("--n-per-family", type=int, default=50, help="held-out prompts per task family (default 50)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(handler=_eval)


def run_eval(store, ref, settings, *, n_per_family: int = 50) -> dict:
    """Evaluate ``ref`` and write the result into its manifest; returns the manifest's ``eval`` entry."""
    from aieng.evaluation.suite import evaluate
    from aieng.loading.loader import LoadConfig, load_version

    loaded = load_version(store, ref, LoadConfig.from_settings(settings))
    report = evaluate(loaded.model, loaded.tokenizer, n_per_family=n_per_family)
    entry = {
        "suite": report.suite,
        "metrics": {"accuracy": report.accuracy, "perplexity": report.perplexity},
        "n_per_family": report.n_per_family,
        "seconds": round(report.seconds, 2),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    store.update_manifest(type(ref)(ref.name, loaded.version), eval=entry)
    return {"name": ref.name, "version": loaded.version, **entry}


def _eval(args: argparse.Namespace) -> int:
    from aieng.store import ModelStore, parse_ref

    settings = settings_from(args)
    result = run_eval(ModelStore(settings.store), parse_ref(args.ref), settings, n_per_family=args.n_per_family)
    if args.json:
        print_json(result)
        return 0
    print(f"{result['name']}@{result['version']}  suite {result['suite']}  ({result['n_per_family']} prompts per family)")
    for family, accuracy in result["metrics"]["accuracy"].items():
        print(f"  {family:12} exact match {accuracy:6.1%}")
    print(f"  {'perplexity':12} {result['metrics']['perplexity']:.3f}")
    print("written to the manifest's `eval` field")
    return 0
