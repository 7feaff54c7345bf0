"""``aieng model ...``: the store's verbs."""

from __future__ import annotations

import argparse
import sys

from aieng.cli.common import print_json, store_from, store_option_parent
from aieng.cli.inspect_cmd import add_inspect
from aieng.store import parse_ref

STORE = store_option_parent()


def add_parser(sub) -> None:
    model = sub.add_parser(
        "model",
        help="register, inspect, verify, promote and roll back model versions",
        description="Manage the verified model store ($AIENG_STORE, default ./var/store).",
    )
    verbs = model.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser(
        "register",
        parents=[STORE],
        help="copy a safetensors model folder into the store and write its manifest",
        description="Copy SRC into the store as NAME@VERSION (status candidate). Hashes every file, "
        "records hardware, dependencies, parameters, dtype and context length. Refuses "
        "pickle weights, existing versions and folders that are not causal LMs.",
    )
    p.add_argument("src", help="a Hugging Face model folder with .safetensors weights")
    p.add_argument("--name", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--source", default=None, help="provenance to record (default: the absolute SRC path)")
    p.add_argument(
        "--suite",
        metavar="FILE",
        default=None,
        help="the eval suite stored (and hashed) with the version; its thresholds are the version's release "
        "gate (default: SRC/eval-suite/suite.yaml if present; docs/evaluation.md)",
    )
    p.set_defaults(handler=_register)

    p = verbs.add_parser("list", parents=[STORE], help="models, versions, status and which is current")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_list)

    p = verbs.add_parser("show", parents=[STORE], help="print a version's manifest (N for current, N@V for a version)")
    p.add_argument("ref", metavar="N[@V]")
    p.set_defaults(handler=_show)

    add_inspect(verbs, [STORE])

    p = verbs.add_parser(
        "verify", parents=[STORE], help="re-hash every file; exit 1 naming each mismatched, missing or extra file"
    )
    p.add_argument("ref", metavar="N[@V]")
    p.set_defaults(handler=_verify)

    p = verbs.add_parser(
        "promote",
        parents=[STORE],
        help="verify V, run the release gate, then point N's `current` at it atomically",
        description="Verify NAME@VERSION's hashes, judge its recorded evaluation (and performance "
        "baseline, if any) against the current version with the release gate "
        "(aieng/evaluation/gate.py), and switch `current` only if it passes. A refusal "
        "exits 1 naming every rule that fired; --force --reason overrides it. The decision, "
        "thresholds, who and why go into the manifest and history.jsonl.",
    )
    p.add_argument("name")
    p.add_argument("version")
    p.add_argument("--reason", default=None, help="why (kept in history.jsonl; required with --force)")
    p.add_argument("--force", action="store_true", help="promote even if the gate refuses (needs --reason)")
    add_reload_option(p)
    add_gate_options(p)
    p.set_defaults(handler=_promote)

    p = verbs.add_parser("rollback", parents=[STORE], help="go back to the previously promoted version (or --to V)")
    p.add_argument("name")
    p.add_argument("--to", default=None, metavar="V", help="roll back to this version instead of the previous one")
    p.add_argument("--reason", default="rollback", help="why (kept in history.jsonl)")
    add_reload_option(p)
    p.set_defaults(handler=_rollback)

    p = verbs.add_parser("remove", parents=[STORE], help="delete a version that is not current")
    p.add_argument("name")
    p.add_argument("version")
    p.set_defaults(handler=_remove)

    p = verbs.add_parser("history", parents=[STORE], help="print the promote/rollback history of a model")
    p.add_argument("name")
    p.set_defaults(handler=_history)

    p = verbs.add_parser(
        "convert",
        parents=[STORE],
        help="explicitly convert pickle weights (.bin/.pt/.pth) to safetensors",
        description="Load pickle weights with torch.load(weights_only=True) (tensors only, no code) "
        "and write SRC's files plus model.safetensors into --out.",
    )
    p.add_argument("src")
    p.add_argument("--out", required=True)
    p.set_defaults(handler=_convert)


def _register(args: argparse.Namespace) -> int:
    manifest = store_from(args).register(args.src, args.name, args.version, provenance=args.source, suite=args.suite)
    print(
        f"registered {manifest.name}@{manifest.version}: {manifest.architecture}, "
        f"{manifest.num_parameters:,} parameters, {manifest.dtype}, {len(manifest.files)} files (status candidate)"
    )
    if manifest.suite:
        print(f"eval suite {manifest.suite['label']} ({manifest.suite['sha256'][:12]}) stored with it")
    else:
        print(
            "no eval suite: the release gate will need a comparison with the current version "
            f"(`aieng eval {manifest.name}@{manifest.version} --compare`) or --force --reason"
        )
    return 0


def _list(args: argparse.Namespace) -> int:
    store = store_from(args)
    rows = []
    for name in store.names():
        current = store.current(name)
        for version in store.versions(name):
            manifest = store.manifest(parse_ref(f"{name}@{version}"))
            rows.append(
                {
                    "name": name,
                    "version": version,
                    "current": version == current,
                    "status": manifest.status,
                    "parameters": manifest.num_parameters,
                    "created_at": manifest.created_at,
                }
            )
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print(
            f"the store at {store.root} is empty; register a model with: aieng model register SRC --name N --version V"
        )
        return 0
    print(f"{'':2}{'NAME':16}{'VERSION':12}{'STATUS':11}{'PARAMETERS':>12}  CREATED")
    for row in rows:
        mark = "* " if row["current"] else "  "
        print(
            f"{mark}{row['name']:16}{row['version']:12}{row['status']:11}{row['parameters']:>12,}  {row['created_at']}"
        )
    return 0


def _show(args: argparse.Namespace) -> int:
    store = store_from(args)
    ref = parse_ref(args.ref)
    data = store.manifest(ref).to_dict()
    data["current"] = store.current(ref.name) == data["version"]
    print_json(data)
    return 0


def _verify(args: argparse.Namespace) -> int:
    report = store_from(args).verify(parse_ref(args.ref))
    if report.ok:
        print(f"{report.name}@{report.version}: OK (every file matches its manifest hash)")
        return 0
    print(f"{report.name}@{report.version}: FAILED verification", file=sys.stderr)
    for problem in report.problems:
        print(f"  {problem}", file=sys.stderr)
    return 1


def add_reload_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reload",
        default=None,
        metavar="URL",
        help="then hot-swap the server at URL (POST /admin/reload with $AIENG_ADMIN_TOKEN) and wait "
        "until every worker serves the new version",
    )


def _reload(args: argparse.Namespace, version: str) -> None:
    if args.reload:
        from aieng.release.reload import reload_server

        versions = reload_server(args.reload, version)
        print(f"{args.reload}: {len(versions)} worker(s) serve {args.name}@{version}")


def add_gate_options(p: argparse.ArgumentParser) -> None:
    """The release gate's thresholds as flags, over those of the candidate's registered suite."""
    g = p.add_argument_group(
        "release gate thresholds (default: the candidate's suite's `thresholds`, else aieng/evaluation/gate.py)"
    )
    g.add_argument(
        "--gate-family",
        action="append",
        dest="gate_families",
        metavar="FAMILY",
        help="a family that must reach its floor (repeat; replaces the suite's floors)",
    )
    g.add_argument("--min-accuracy", type=float, default=None, help="the floor of every gated family")
    g.add_argument(
        "--max-regression",
        type=float,
        default=None,
        help="largest drop of any family below the current version (default 0.05)",
    )
    g.add_argument("--max-perplexity", type=float, default=None, help="perplexity ceiling (default: none)")
    g.add_argument(
        "--max-perplexity-rise",
        type=float,
        default=None,
        help="largest perplexity rise over the current version, as a fraction (default 0.25)",
    )
    g.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        help="comparison gate: share of greedy answers equal to the current version's (default 0.9)",
    )
    g.add_argument(
        "--max-perplexity-ratio",
        type=float,
        default=None,
        help="comparison gate: perplexity of the current version's answers under the candidate over "
        "under itself (default 1.25)",
    )


def gate_overrides(args: argparse.Namespace) -> dict:
    """The gate flags given, as overrides of the candidate's suite thresholds."""
    return {
        "gate_families": args.gate_families,
        "min_accuracy": args.min_accuracy,
        "max_regression": args.max_regression,
        "max_perplexity": args.max_perplexity,
        "max_perplexity_rise": args.max_perplexity_rise,
        "min_agreement": args.min_agreement,
        "max_perplexity_ratio": args.max_perplexity_ratio,
    }


def _promote(args: argparse.Namespace) -> int:
    from aieng.release.promotion import promote

    result = promote(
        store_from(args), args.name, args.version, overrides=gate_overrides(args), force=args.force, reason=args.reason
    )
    event = result.event
    if result.forced:
        print(
            f"gate FAILED and was overridden by {event['actor']} ({args.reason}): "
            + "; ".join(result.decision.messages),
            file=sys.stderr,
        )
    else:
        print(
            f"gate passed ({', '.join(k for k, v in result.decision.compared.items() if v) or 'no'} comparison "
            f"with the current version)"
        )
    print(f"{args.name}: current {event['from'] or '(none)'} -> {event['to']}")
    _reload(args, event["to"])
    return 0


def _rollback(args: argparse.Namespace) -> int:
    event = store_from(args).rollback(args.name, args.to, reason=args.reason)
    print(f"{args.name}: rolled back {event['from']} -> {event['to']}")
    _reload(args, event["to"])
    return 0


def _remove(args: argparse.Namespace) -> int:
    store_from(args).remove(args.name, args.version)
    print(f"removed {args.name}@{args.version}")
    return 0


def _history(args: argparse.Namespace) -> int:
    for event in store_from(args).history(args.name):
        gate = event.get("gate")
        note = ""
        if gate is not None:
            fired = [f["rule"] for f in gate["decision"]["failures"]]
            note = (
                "  [gate passed]"
                if not fired
                else f"  [gate {'overridden' if gate.get('forced') else 'refused'}: {', '.join(dict.fromkeys(fired))}]"
            )
        if "weight" in event:  # a canary step
            note += f"  [{event['weight']:.0%} of traffic]"
        print(
            f"{event.get('ts', '-')}  {event['action']:18}  "
            f"{event.get('from') or '-':>8} -> {event.get('to') or '-':<8}  "
            f"{event.get('actor', '-')}: {event.get('reason', '')}{note}"
        )
    return 0


def _convert(args: argparse.Namespace) -> int:
    from aieng.store.convert import convert_to_safetensors

    out = convert_to_safetensors(args.src, args.out)
    print(
        f"converted {args.src} -> {out}/model.safetensors; register it with: "
        f"aieng model register {out} --name N --version V"
    )
    return 0
