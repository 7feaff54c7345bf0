"""``aieng eval N[@V]``: held-out quality of a store version, written into its manifest."""

from __future__ import annotations

import argparse

from aieng.cli.common import print_json, settings_from, store_option_parent

STORE = store_option_parent()


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        parents=[STORE],
        help="held-out exact-match accuracy per task family and perplexity; saved in the manifest",
        description="Load N (current) or N@V from the store (hash-verified), run the held-out suite, "
        "print the metrics and record them in the version's manifest under `eval`.",
    )
    p.add_argument("ref", metavar="N[@V]")
    p.add_argument("--n-per-family", type=int, default=50, help="held-out prompts per task family (default 50)")
    p.add_argument(
        "--int8",
        action="store_true",
        help="evaluate with int8 dynamic quantization (CPU) and record the accuracy delta against the "
        "recorded full-precision result under eval.variants.int8",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="bfloat16: evaluate the decoder layers' matrix multiplies in bf16, as the engine runs small "
        "batches (see `aieng serve --help`, AIENG_WEIGHT_FORMATS), and record the accuracy delta "
        "against the recorded fp32 result under eval.variants.bfloat16",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["model", "bfloat16"],
        default="model",
        help="bfloat16: evaluate with keys and values rounded to bf16 as a bf16 KV cache holds them "
        "(AIENG_KV_CACHE_DTYPE) and record the accuracy delta under eval.variants.kv_bfloat16",
    )
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(handler=_eval)


def _variant(args: argparse.Namespace) -> str | None:
    chosen = [
        name
        for name, on in (
            ("int8", args.int8),
            ("bfloat16", args.dtype == "bfloat16"),
            ("kv_bfloat16", args.kv_cache_dtype == "bfloat16"),
        )
        if on
    ]
    if len(chosen) > 1:
        raise SystemExit(
            f"aieng eval: choose one of --int8, --dtype bfloat16, --kv-cache-dtype bfloat16 (got {chosen})"
        )
    return chosen[0] if chosen else None


def _eval(args: argparse.Namespace) -> int:
    from aieng.evaluation.record import evaluate_version
    from aieng.loading.loader import LoadConfig
    from aieng.store import ModelStore, parse_ref

    settings = settings_from(args)
    result = evaluate_version(
        ModelStore(settings.store),
        parse_ref(args.ref),
        LoadConfig.from_settings(settings),
        n_per_family=args.n_per_family,
        variant=_variant(args),
    )
    if args.json:
        print_json(result)
        return 0
    print(
        f"{result['name']}@{result['version']}  suite {result['suite']}  ({result['n_per_family']} prompts per family)"
    )
    for family, accuracy in result["metrics"]["accuracy"].items():
        print(f"  {family:12} exact match {accuracy:6.1%}")
    print(f"  {'perplexity':12} {result['metrics']['perplexity']:.3f}")
    if result.get("variant"):
        delta, variant = result["delta"], result["variant"]
        print(
            f"  {variant} delta "
            + ", ".join(f"{f} {d:+.1%}" for f, d in delta["accuracy"].items())
            + f", perplexity {delta['perplexity']:+.3f}"
        )
        print(f"written to the manifest's `eval.variants.{variant}` field")
        return 0
    print("written to the manifest's `eval` field")
    return 0
