"""``aieng bench ...``: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import argparse
from pathlib import Path

from aieng.cli.common import print_json, settings_from, store_option_parent
from aieng.settings import WEIGHT_FORMATS

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
    p.add_argument("--weight-formats", choices=list(FORMATS), default="auto",
                   help="as AIENG_WEIGHT_FORMATS for `aieng serve`: auto measures at which step sizes bf16 weights "
                        "beat fp32 on this CPU and from which size oneDNN-packed copies win (default auto, what the "
                        "server runs)")
    _attention_options(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_engine)

    p = kinds.add_parser("serve", parents=[STORE],
                         help="req/s, tok/s, p50/p99 latency and TTFT over HTTP at C = 1, 8, 32, 64 concurrent clients",
                         description="Starts the packaged server (batching on, then off with max_batch_size=1) and "
                                     "each --peer, one at a time on loopback; drives each with C concurrent streaming "
                                     "clients (same prompts through the chat template to /v1/completions, same "
                                     "max_tokens with EOS ignored, temperature 0, bounded request count, an untimed "
                                     "warm-up round); tok/s counts completion tokens. Also measures PSS of 2 preloaded "
                                     "workers against 1. Targets: batching on >= 6x off at C=32; >= 1.5x transformers "
                                     "at C=32 and 64 with p99 no worse; TTFT p99 at C=32 <= 1 s; PSS of the service "
                                     "(master + workers) with 2 workers <= 1.3 x with 1. Peers: transformers = "
                                     "`transformers serve <folder> --continuous-batching`; llama.cpp = llama.cpp's "
                                     "`llama-server` (--parallel slots, continuous batching) on a GGUF of the model, "
                                     "converted once per model hash and --peer-format; llama-cpp-python = "
                                     "`python -m llama_cpp.server` on the same GGUF (one request at a time). A peer "
                                     "that is not installed is skipped with the command that installs it. Issue #10's "
                                     "comparison: --peer llama.cpp --peer-format f32,q8_0 --peer transformers "
                                     "--plain-forward --concurrency 1,32 --max-tokens 64.")
    p.add_argument("--model", default=None, metavar="N[@V]", help="store reference (default: $AIENG_MODEL)")
    p.add_argument("--peer", action="append", default=None, metavar="NAME[,NAME]",
                   help="a server to measure beside aieng, repeatable or comma-separated: transformers, llama.cpp, "
                        "llama-cpp-python; a GGUF peer may name its format: llama.cpp:q8_0")
    p.add_argument("--peer-format", default="f32", metavar="FMT[,FMT]",
                   help="GGUF weights for the llama.cpp peers: f32 (exact), q8_0, or both comma-separated (default f32)")
    p.add_argument("--peer-threads", type=int, default=0, metavar="N",
                   help="compute threads of the llama.cpp peers (default: the torch threads one aieng worker gets here)")
    p.add_argument("--gguf-cache", type=Path, default=None, metavar="DIR",
                   help="where GGUF conversions are kept, by model hash (default ~/.cache/aieng/gguf)")
    p.add_argument("--no-aieng", action="store_true", help="measure the peers alone (no aieng server, no PSS)")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated client counts")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=64, help="requests per level (at least 2 x C)")
    p.add_argument("--no-batching-off", action="store_true", help="skip the max_batch_size=1 run")
    p.add_argument("--no-pss", action="store_true", help="skip the PSS measurement")
    p.add_argument("--plain-forward", action="store_true",
                   help="also time transformers' plain batched forward at batch 32 in this process once the servers "
                        "have stopped (the hardware's reference rate) and report aieng's C=32 share of it (target >= 0.8)")
    p.add_argument("--metrics-overhead", type=int, default=0, metavar="ROUNDS",
                   help="also measure the cost of Prometheus metrics: servers with AIENG_METRICS=1 and =0 driven in "
                        "ROUNDS alternating rounds at C=32 (p50 latency and server CPU per request)")
    p.add_argument("--save-baseline", action="store_true",
                   help="write the C=32 numbers into the model version's manifest as performance_baseline")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_serve)

    p = kinds.add_parser("context", parents=[STORE],
                         help="long context: decode step at KV 64 vs 1,256, and streams' inter-token p99 while a "
                              "1,000-token prompt joins (chunked prefill)",
                         description="On the engine alone (no HTTP), median over --repeats, runs alternated: the "
                                     "decode step of --batch rows at KV length 64 and at 1,256 (target ratio <= 1.3), "
                                     "then --streams rows decoding while a --join-tokens prompt joins (target: their "
                                     "inter-token p99 <= 2 x the median step). Also the plain batched forward's "
                                     "decode rate at batch 32 (transformers' forward alone) as the hardware reference.")
    _engine_bench_options(p, batch=1, repeats=3)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--join-tokens", type=int, default=1000)
    p.set_defaults(handler=_context)

    p = kinds.add_parser("grammar", parents=[STORE],
                         help="constrained decoding: the masks' cost at batch 32, and JSON validity and accuracy "
                              "free vs constrained",
                         description="On the engine alone (no HTTP). Cost: --batch rows decode --new-tokens each, free "
                                     "and under a JSON schema they cannot complete in that budget (forced: every row "
                                     "masked every step), alternated, median over --repeats (target: <= 15% of decode "
                                     "throughput); with --json-task also held-out json prompts under their own "
                                     "schemas (json_task: the model mostly agrees). Effect (--json-task, on "
                                     "the demo model): its held-out json prompts free, with json_object and with a "
                                     "schema per prompt, greedy and sampled at temperature 1.")
    _engine_bench_options(p, batch=32, repeats=5)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--json-task", action=argparse.BooleanOptionalAction, default=None,
                   help="measure validity and accuracy on the demo's json prompts (default: on for a model whose "
                        "name starts with demo)")
    p.set_defaults(handler=_grammar)


FORMATS = WEIGHT_FORMATS


def _attention_options(p) -> None:
    p.add_argument("--decode-attention", choices=["auto", "sdpa"], default="auto",
                   help="as AIENG_DECODE_ATTENTION: auto = aieng's CPU kernel (when it builds), sdpa = PyTorch's")
    p.add_argument("--kv-cache-dtype", choices=["auto", "model", "bfloat16"], default="auto",
                   help="as AIENG_KV_CACHE_DTYPE (default auto, as the server)")


def _engine_bench_options(p, *, batch: int, repeats: int) -> None:
    """What every engine-only benchmark takes: the model, the batch, repeats, the serving settings."""
    p.add_argument("--model", default=None, metavar="PATH|N[@V]", help="a model folder or a store reference")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--weight-formats", choices=list(FORMATS), default="auto")
    _attention_options(p)
    p.add_argument("--json", action="store_true")


def _grammar(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng.bench.grammar_bench import json_task_report, measure_mask_cost
    from aieng.engine.config import EngineConfig
    from aieng.engine.engine import Engine

    loaded, label = load_for_bench(args)
    config = EngineConfig(compile=args.compile, weight_formats=args.weight_formats,
                          decode_attention=args.decode_attention, kv_cache_dtype=args.kv_cache_dtype,
                          max_rows=max(32, args.batch), compile_budget_s=None)  # measure the compiled engine
    engine = Engine(loaded.model, loaded.tokenizer, context_length=loaded.context_length, config=config)
    with tqdm(total=2 * args.repeats, desc="bench grammar", unit="run", disable=args.json) as bar:
        engine.warmup(progress=lambda detail: bar.set_postfix_str(detail[:60]))
        json_task = args.json_task if args.json_task is not None else Path(label).name.startswith("demo")
        workloads = ("forced", "json_task") if json_task else ("forced",)
        bar.total = 2 * args.repeats * len(workloads)
        result = {"model": label, "compile": engine.compiled,
                  "cost": {w: measure_mask_cost(engine, batch=args.batch, new_tokens=args.new_tokens, workload=w,
                                                repeats=args.repeats, progress=bar.update).to_dict() for w in workloads}}
    if json_task:
        result["json_task"] = {f"temperature_{t:g}": json_task_report(engine, temperature=t) for t in (0.0, 1.0)}
    if args.json:
        print_json(result)
        return 0
    print(f"model {label}, median of {args.repeats}, tokens/s free and constrained (target: cost <= 15%)")
    for workload, cost in result["cost"].items():
        print(f"  {workload:10} batch {cost['batch']:3}   free {cost['free_tok_s']:9.1f}   constrained "
              f"{cost['constrained_tok_s']:9.1f}   cost {cost['cost_pct']:5.1f}%")
    for name, report in result.get("json_task", {}).items():
        print(f"  {report['prompts']} held-out json prompts, {name.replace('_', ' ')}:")
        for mode in ("free", "json_object", "json_schema"):
            print(f"    {mode:12} valid {report[mode]['valid']:6.1%}   accurate {report[mode]['accuracy']:6.1%}")
    return 0


def _context(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng.bench.context_bench import run_context_bench
    from aieng.bench.plain_forward import plain_decode_tokens_per_s
    from aieng.engine.config import EngineConfig
    from aieng.engine.engine import Engine

    loaded, label = load_for_bench(args)
    config = EngineConfig(compile=args.compile, weight_formats=args.weight_formats,
                          decode_attention=args.decode_attention, kv_cache_dtype=args.kv_cache_dtype,
                          max_rows=max(32, args.streams + 1, args.batch), compile_budget_s=None)
    engine = Engine(loaded.model, loaded.tokenizer, context_length=loaded.context_length, config=config)
    with tqdm(desc="bench context", unit="step", disable=args.json) as bar:
        engine.warmup(progress=lambda detail: bar.set_postfix_str(detail[:60]))
        result = run_context_bench(engine, batch=args.batch, repeats=args.repeats, streams=args.streams,
                                   join_tokens=args.join_tokens, progress=bar.update).to_dict()
        result["plain_forward_b32_tok_s"] = round(plain_decode_tokens_per_s(loaded.model, batch=32), 1)
    if args.json:
        print_json(result)
        return 0
    print(f"model {label}, batch {result['batch']}, prefill chunk {result['chunk_tokens']} tokens")
    print(f"  decode step at KV {result['short_kv']:5}   {result['short_step_ms']:8.2f} ms")
    print(f"  decode step at KV {result['long_kv']:5}   {result['long_step_ms']:8.2f} ms   ratio {result['step_ratio']:.2f} "
          f"(target <= 1.3)")
    print(f"  {result['streams']} streams, a {result['join_tokens']}-token prompt joins: median step "
          f"{result['median_step_ms']:.1f} ms, inter-token p99 {result['itl_p99_ms']:.1f} ms = "
          f"{result['itl_p99_over_median']:.2f} x (target <= 2)")
    print(f"  plain batched forward, batch 32: {result['plain_forward_b32_tok_s']:.1f} tok/s (the hardware reference)")
    return 0


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
    from aieng.engine.config import EngineConfig

    loaded, label = load_for_bench(args)
    with tqdm(total=7 if args.compile else 5, desc="bench engine", unit="method", disable=args.json) as bar:
        result = run_engine_bench(loaded.model, loaded.tokenizer, new_tokens=args.new_tokens, repeats=args.repeats,
                                  label=label, engine_config=EngineConfig(
                                      compile=args.compile, quantize_int8=args.int8,
                                      weight_formats=args.weight_formats, decode_attention=args.decode_attention,
                                      kv_cache_dtype=args.kv_cache_dtype, compile_budget_s=None),
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

    from aieng.bench.peers import parse_peers
    from aieng.bench.serve_bench import ServeBenchConfig, format_table, run_serve_bench
    from aieng.errors import ConfigError
    from aieng.store import ModelRef, ModelStore, parse_ref

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would bury the table
    logging.getLogger("gguf").setLevel(logging.WARNING)  # the GGUF writer's per-file INFO lines, likewise
    try:
        peers = parse_peers(args.peer, args.peer_format)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings = settings_from(args)
    store = ModelStore(settings.store)
    ref = parse_ref(args.model or settings.model)
    version = store.resolve(ref)
    folder = store.version_dir(ref.name, version)
    store.verify_or_raise(ModelRef(ref.name, version))
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    levels = tuple(int(c) for c in args.concurrency.split(","))
    config = ServeBenchConfig(concurrencies=levels, max_tokens=args.max_tokens, requests_per_level=args.requests,
                              peers=tuple(peers), include_batching_off=not args.no_batching_off,
                              measure_pss=not args.no_pss, metrics_overhead_rounds=args.metrics_overhead,
                              peer_threads=args.peer_threads, gguf_cache=args.gguf_cache,
                              peer_slots=settings.max_batch_size, include_aieng=not args.no_aieng,
                              plain_forward=args.plain_forward)
    configs = (0 if args.no_aieng else 1 + (not args.no_batching_off)) + len(peers)
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
                    "plain_forward": bench.plain_forward, "peer_errors": bench.peer_errors,
                    "peer_info": bench.peer_info, "targets": bench.targets})
    else:
        print(format_table(bench))
    return 0
