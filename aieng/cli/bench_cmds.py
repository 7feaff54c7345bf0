"""``aieng bench ...``: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import argparse
from pathlib import Path

from aieng.cli.common import print_json, settings_from, store_option_parent

STORE = store_option_parent()


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (engine against transformers, ...)",
                           description="Benchmarks compare side by side in one process and report ratios.")
    kinds = bench.add_subparsers(dest="kind", metavar="KIND", required=True)
    p = kinds.add_parser("engine", parents=[STORE],
                         help="tokens/s: transformers pipeline and generate() vs the aieng loop at batch 1, 8, 32",
                         description="Same model, same prompts, greedy, a fixed number of new tokens (EOS ignored), "
                                     "warm-ups excluded, median over --repeats. Targets on the demo model: "
                                     "ratio_vs_generate >= 1.4, ratio_vs_pipeline >= 1.5, b32 >= 8 x b1.")
    p.add_argument("--model", default=None, metavar="PATH|N[@V]", help="a model folder or a store reference (default: $AIENG_MODEL)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="torch.compile the aieng forward (prefill and decode), as `aieng serve` does by default (on); the eager "
                        "loop is measured too, in the same run, and reported as eager_*")
    p.add_argument("--int8", action="store_true", help="dynamic int8 quantization of Linear layers (CPU)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_engine)

    p = kinds.add_parser("serve", parents=[STORE],
                         help="req/s, tok/s, p50/p99 latency and TTFT over HTTP at C = 1, 8, 32, 64 concurrent clients",
                         description="Starts the packaged server (batching on, then off with max_batch_size=1) and, "
                                     "with --peer transformers, `transformers serve <folder> --continuous-batching`, "
                                     "one at a time on loopback; drives each with C concurrent streaming clients "
                                     "(same prompts, same max_tokens with EOS ignored, temperature 0, bounded request "
                                     "count, an untimed warm-up round). Also measures PSS of 2 preloaded workers "
                                     "against 1. Targets: batching on >= 6x off at C=32; >= 1.5x transformers at "
                                     "C=32 and 64 with p99 no worse; TTFT p99 at C=32 <= 1 s; PSS of the service (master + "
                                     "workers) with 2 workers <= 1.3 x with 1.")
    p.add_argument("--model", default=None, metavar="N[@V]", help="store reference (default: $AIENG_MODEL)")
    p.add_argument("--peer", choices=["transformers"], default=None)
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated client counts")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=64, help="requests per level (at least 2 x C)")
    p.add_argument("--no-batching-off", action="store_true", help="skip the max_batch_size=1 run")
    p.add_argument("--no-pss", action="store_true", help="skip the PSS measurement")
    p.add_argument("--metrics-overhead", type=int, default=0, metavar="ROUNDS",
                   help="also measure the cost of Prometheus metrics: servers with AIENG_METRICS=1 and =0 driven in "
                        "ROUNDS alternating rounds at C=32 (p50 latency and server CPU per request)")
    p.add_argument("--save-baseline", action="store_true",
                   help="write the C=32 numbers into the model version's manifest as performance_baseline")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_serve)


def load_for_bench(args):
    """A folder path loads unregistered (no hashes); anything else is a store reference (verified)."""
    from aieng.loading.loader import LoadConfig, load_folder, load_version
    from aieng.store import ModelStore, parse_ref

    settings = settings_from(args)
    target = args.model or settings.model
    config = LoadConfig.from_settings(settings)
    if Path(target).is_dir():
        return load_folder(target, config), target
    return load_version(ModelStore(settings.store), parse_ref(target), config), target


def _engine(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng.bench.engine_bench import run_engine_bench
    from aieng.engine.engine import EngineConfig

    loaded, label = load_for_bench(args)
    with tqdm(total=7 if args.compile else 5, desc="bench engine", unit="method", disable=args.json) as bar:
        result = run_engine_bench(loaded.model, loaded.tokenizer, new_tokens=args.new_tokens, repeats=args.repeats,
                                  label=label, engine_config=EngineConfig(compile=args.compile, quantize_int8=args.int8),
                                  progress=bar)
    data = result.to_dict()
    if args.json:
        print_json(data)
        return 0
    print(f"model {label}, {args.new_tokens} new tokens, greedy, median of {args.repeats}, {data['threads']} threads")
    for key in ("hf_pipeline_tok_s", "hf_generate_tok_s", "aieng_b1_tok_s", "aieng_b8_tok_s", "aieng_b32_tok_s"):
        print(f"  {key:20} {data[key]:10.1f} tok/s")
    print(f"  ratio_vs_generate    {data['ratio_vs_generate']:.2f}  (target >= 1.4)")
    print(f"  ratio_vs_pipeline    {data['ratio_vs_pipeline']:.2f}  (target >= 1.5)")
    print(f"  b32 / b1             {data['b32_over_b1']:.2f}  (target >= 8)")
    print(f"  warm-up              {data['warmup_s']:.1f} s" + (" (includes torch.compile)" if data["compile"] else ""))
    if data["eager_b1_tok_s"]:
        print(f"  compile speed-up     b1 {data['aieng_b1_tok_s'] / data['eager_b1_tok_s']:.2f}x, "
              f"b32 {data['aieng_b32_tok_s'] / data['eager_b32_tok_s']:.2f}x (against the eager loop, same run)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import logging
    import sys
    from datetime import datetime, timezone

    from transformers import AutoTokenizer
    from tqdm import tqdm

    from aieng.bench.serve_bench import ServeBenchConfig, format_table, run_serve_bench
    from aieng.store import ModelRef, ModelStore, parse_ref

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would bury the table
    settings = settings_from(args)
    store = ModelStore(settings.store)
    ref = parse_ref(args.model or settings.model)
    version = store.resolve(ref)
    folder = store.version_dir(ref.name, version)
    store.verify_or_raise(ModelRef(ref.name, version))
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    levels = tuple(int(c) for c in args.concurrency.split(","))
    config = ServeBenchConfig(concurrencies=levels, max_tokens=args.max_tokens, requests_per_level=args.requests,
                              peer=args.peer, include_batching_off=not args.no_batching_off, measure_pss=not args.no_pss,
                              metrics_overhead_rounds=args.metrics_overhead)
    configs = 1 + (not args.no_batching_off) + (args.peer is not None)
    total = configs * sum(max(args.requests, 2 * c) for c in levels) \
        + 2 * args.metrics_overhead * max(args.requests, 64)
    with tqdm(total=total, desc="bench serve", unit="req", disable=args.json, file=sys.stderr) as bar:
        bench = run_serve_bench(settings.store, f"{ref.name}@{version}", folder, tokenizer, config, progress=bar,
                                log=lambda m: bar.write(m) if not args.json else None)
    if args.save_baseline and 32 in bench.results.get("aieng", {}):
        m = bench.results["aieng"][32]
        store.update_manifest(ModelRef(ref.name, version), performance_baseline={
            "concurrency": 32, "max_tokens": args.max_tokens, "req_per_s": m["req_per_s"],
            "tokens_per_s": m["output_tok_per_s"], "latency_p50_s": m["latency_p50_s"],
            "latency_p99_s": m["latency_p99_s"], "ttft_p99_s": m["ttft_p99_s"],
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    if args.json:
        print_json({"results": bench.results, "pss": bench.pss, "metrics_overhead": bench.metrics_overhead,
                    "peer_error": bench.peer_error, "targets": bench.targets})
    else:
        print(format_table(bench))
    return 0
