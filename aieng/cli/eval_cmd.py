"""``aieng eval N[@V]``: a store version graded on an eval suite, or compared with the current
version, written into its manifest; ``--suite-from-capture`` turns captured requests into cases."""

from __future__ import annotations

import argparse

from aieng.cli.common import print_json, settings_from, store_option_parent

STORE = store_option_parent()


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        parents=[STORE],
        help="grade a version on its eval suite (per-family rates, perplexity) or compare it with the current one",
        description="Load N (current) or N@V from the store (hash-verified), answer the suite's gate "
        "cases, grade them with the suite's assertions, print the rates and record them, every "
        "case's result and the suite's hash in the version's manifest under `eval`. The suite is "
        "--suite FILE, else the one registered with the version (docs/evaluation.md). With --url "
        "the running server answers instead (a check of what it serves). With --compare the "
        "version's greedy answers are compared with the current version's (the gate for models "
        "without labels), recorded under `comparison`.",
    )
    p.add_argument("ref", metavar="N[@V]", nargs="?", help="the version (not with --suite-from-capture)")
    p.add_argument("--suite", metavar="FILE", help="the suite file (default: the one registered with the version)")
    p.add_argument(
        "--n-per-family", type=int, default=None, help="at most this many gate cases per family (default: all)"
    )
    p.add_argument("--url", help="grade what the server at URL answers for N@V instead of loading the weights")
    p.add_argument(
        "--record", action="store_true", help="with --url: record the result in the manifest (default: only print)"
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="compare N@V's greedy answers with --against's (default: current) on the suite's cases or --prompts",
    )
    p.add_argument("--against", metavar="V", help="with --compare: the version to compare with (default: current)")
    p.add_argument(
        "--prompts", metavar="FILE", help="with --compare: .txt (a prompt per line) or .jsonl (messages/prompt)"
    )
    p.add_argument(
        "--suite-from-capture",
        nargs="+",
        metavar="CAPTURE",
        help="write the captured requests (JSONL files or their folder) as suite cases to label, to --out",
    )
    p.add_argument("--out", metavar="FILE", help="with --suite-from-capture: the suite file to write (must not exist)")
    p.add_argument(
        "--int8",
        action="store_true",
        help="evaluate with int8 dynamic quantization (CPU) and record the accuracy delta against the "
        "recorded full-precision result under eval.variants.int8",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "int8", "int4"],
        default="float32",
        help="bfloat16: evaluate the decoder layers' matrix multiplies in bf16, as the engine runs small "
        "batches (see `aieng serve --help`, AIENG_WEIGHT_FORMATS), and record the accuracy delta "
        "against the recorded fp32 result under eval.variants.bfloat16; int8: the layers' and the output "
        "projection's weights rounded as AIENG_WEIGHT_FORMATS=int8 rounds them (groups of up to 128 "
        "weights per scale), recorded under eval.variants.int8_weights; int4: as AIENG_WEIGHT_FORMATS=int4 "
        "computes (4-bit weights in groups of 32, inputs rounded to int8 per group), under "
        "eval.variants.int4_weights",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["model", "bfloat16"],
        default="model",
        help="bfloat16: evaluate with keys and values rounded to bf16 as a bf16 KV cache holds them "
        "(AIENG_KV_CACHE_DTYPE) and record the accuracy delta under eval.variants.kv_bfloat16",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_eval)


def _variant(args: argparse.Namespace) -> str | None:
    chosen = [
        name
        for name, on in (
            ("int8", args.int8),
            ("bfloat16", args.dtype == "bfloat16"),
            ("int8_weights", args.dtype == "int8"),
            ("int4_weights", args.dtype == "int4"),
            ("kv_bfloat16", args.kv_cache_dtype == "bfloat16"),
        )
        if on
    ]
    if len(chosen) > 1:
        raise SystemExit(
            f"aieng eval: choose one of --int8, --dtype bfloat16|int8|int4, --kv-cache-dtype bfloat16 (got {chosen})"
        )
    return chosen[0] if chosen else None


def _eval(args: argparse.Namespace) -> int:
    from aieng.loading.loader import LoadConfig
    from aieng.store import ModelStore, parse_ref

    if args.suite_from_capture:
        return _from_capture(args)
    if not args.ref:
        raise SystemExit("aieng eval: give the version to evaluate, N or N@V (or --suite-from-capture FILE --out F)")
    settings = settings_from(args)
    store, ref = ModelStore(settings.store), parse_ref(args.ref)
    if args.compare:
        return _compare(args, store, ref, LoadConfig.from_settings(settings))
    if args.url:
        from aieng.evaluation.record import evaluate_version_at

        result = evaluate_version_at(
            store, ref, args.url, suite=args.suite, n_per_family=args.n_per_family, record=args.record
        )
    else:
        from aieng.evaluation.record import evaluate_version

        result = evaluate_version(
            store,
            ref,
            LoadConfig.from_settings(settings),
            suite=args.suite,
            n_per_family=args.n_per_family,
            variant=_variant(args),
        )
    if args.json:
        print_json({k: v for k, v in result.items() if k != "cases"})
        return 0
    where = f"served by {args.url}" if args.url else "in process"
    print(f"{result['name']}@{result['version']}  suite {result['suite']} ({result['suite_sha256'][:12]}), {where}")
    for family, rate in result["metrics"]["accuracy"].items():
        print(f"  {family:12} pass rate {rate:6.1%}")
    if not result["metrics"]["accuracy"]:
        print("  (no case has assertions: nothing graded; compare it with --compare, or label the suite)")
    perplexity = result["metrics"].get("perplexity")
    print(f"  {'perplexity':12} {perplexity:.3f}" if perplexity is not None else "  perplexity   not measured")
    for family, mistakes in result.get("mistakes", {}).items():
        for mistake in mistakes[:1]:
            print(f"  e.g. {family} {mistake['id']}: {'; '.join(mistake['why'])}")
    if result.get("variant"):
        delta, variant = result["delta"], result["variant"]
        print(f"  {variant} delta " + ", ".join(f"{f} {d:+.1%}" for f, d in delta["accuracy"].items()))
        from aieng.evaluation.record import CHANGED_KEPT

        same = result["agreement"]
        if same["greedy_cases"]:
            more = ", ..." if len(same["changed"]) == CHANGED_KEPT else ""
            changed = f" (changed: {', '.join(same['changed'])}{more})"
            print(
                f"  {variant} greedy answers equal to full precision's: {same['same_answer']:.1%} of "
                f"{same['greedy_cases']}" + (changed if same["changed"] else "")
            )
        print(f"written to the manifest's `eval.variants.{variant}` field")
    elif args.url and not args.record:
        print("not recorded (add --record to keep it in the manifest)")
    else:
        print("written to the manifest's `eval` field")
    return 0


def _compare(args, store, ref, config) -> int:
    from aieng.evaluation.compare import compare_versions
    from aieng.evaluation.record import suite_for

    version = store.resolve(ref)
    suite = None if args.prompts else suite_for(store, ref, args.suite)
    result = compare_versions(
        store,
        ref.name,
        version,
        against=args.against,
        config=config,
        suite=suite,
        prompts=args.prompts,
        per_family=args.n_per_family,
    )
    if args.json:
        print_json(result)
        return 0
    m = result["metrics"]
    print(f"{ref.name}@{version} against {ref.name}@{result['against']} on {m['cases']} prompts (greedy)")
    print(f"  agreement     {m['agreement']:6.1%}  ({m['changed']} answers changed)")
    print(f"  length ratio  {m['length_ratio']:.2f}")
    print(f"  empty         {m['empty_rate']:6.1%}  (was {m['stable_empty_rate']:.1%})")
    print(f"  refusals      {m['refusal_rate']:6.1%}  (was {m['stable_refusal_rate']:.1%})")
    if m["perplexity_ratio"] is not None:
        print(f"  perplexity of the current answers: {m['perplexity_ratio']:.3f}x under the candidate")
    for changed in result["changed"][:3]:
        print(f"  changed {changed['id']}: {changed['stable']!r} -> {changed['candidate']!r}")
    print("written to the manifest's `comparison` field; `aieng model promote` judges it")
    return 0


def _from_capture(args) -> int:
    from aieng.evaluation.from_capture import write_suite_from_capture

    if not args.out:
        raise SystemExit("aieng eval --suite-from-capture: say where to write the suite with --out FILE")
    out = write_suite_from_capture(args.suite_from_capture, args.out)
    print(f"wrote {out}: label the cases worth grading (add `expect:`), then `aieng eval N@V --suite {out}`")
    return 0
