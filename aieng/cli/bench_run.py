"""What each ``aieng bench`` command does once its arguments are parsed (``bench_cmds`` declares them)."""

from __future__ import annotations

import argparse
from datetime import UTC
from pathlib import Path

from aieng.cli.common import print_json, settings_from


def grammar(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng.bench.grammar_bench import json_task_report, measure_mask_cost

    loaded, label = load_for_bench(args)
    engine = measured_engine(args, loaded, max_rows=max(32, args.batch))
    with tqdm(total=2 * args.repeats, desc="bench grammar", unit="run", disable=args.json) as bar:
        engine.warmup(progress=lambda detail: bar.set_postfix_str(detail[:60]))
        json_task = args.json_task if args.json_task is not None else Path(label).name.startswith("demo")
        workloads = ("forced", "json_task") if json_task else ("forced",)
        bar.total = 2 * args.repeats * len(workloads)
        result = {
            "model": label,
            "compile": engine.compiled,
            "cost": {
                w: measure_mask_cost(
                    engine,
                    batch=args.batch,
                    new_tokens=args.new_tokens,
                    workload=w,
                    repeats=args.repeats,
                    progress=bar.update,
                ).to_dict()
                for w in workloads
            },
        }
    if json_task:
        result["json_task"] = {f"temperature_{t:g}": json_task_report(engine, temperature=t) for t in (0.0, 1.0)}
    if args.json:
        print_json(result)
        return 0
    print(f"model {label}, median of {args.repeats}, tokens/s free and constrained (target: cost <= 15%)")
    for workload, cost in result["cost"].items():
        print(
            f"  {workload:10} batch {cost['batch']:3}   free {cost['free_tok_s']:9.1f}   constrained "
            f"{cost['constrained_tok_s']:9.1f}   cost {cost['cost_pct']:5.1f}%"
        )
    for name, report in result.get("json_task", {}).items():
        print(f"  {report['prompts']} held-out json prompts, {name.replace('_', ' ')}:")
        for mode in ("free", "json_object", "json_schema"):
            print(f"    {mode:12} valid {report[mode]['valid']:6.1%}   accurate {report[mode]['accuracy']:6.1%}")
    return 0


def context(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng.bench.context_bench import run_context_bench
    from aieng.bench.plain_forward import plain_decode_tokens_per_s

    loaded, label = load_for_bench(args)
    engine = measured_engine(args, loaded, max_rows=max(32, args.streams + 1, args.batch))
    with tqdm(desc="bench context", unit="step", disable=args.json) as bar:
        engine.warmup(progress=lambda detail: bar.set_postfix_str(detail[:60]))
        result = run_context_bench(
            engine,
            batch=args.batch,
            repeats=args.repeats,
            streams=args.streams,
            join_tokens=args.join_tokens,
            progress=bar.update,
        ).to_dict()
        result["plain_forward_b32_tok_s"] = round(plain_decode_tokens_per_s(loaded.model, batch=32), 1)
    if args.json:
        print_json(result)
        return 0
    print(f"model {label}, batch {result['batch']}, prefill chunk {result['chunk_tokens']} tokens")
    print(f"  decode step at KV {result['short_kv']:5}   {result['short_step_ms']:8.2f} ms")
    print(
        f"  decode step at KV {result['long_kv']:5}   {result['long_step_ms']:8.2f} ms   "
        f"ratio {result['step_ratio']:.2f} (target <= 1.3)"
    )
    print(
        f"  {result['streams']} streams, a {result['join_tokens']}-token prompt joins: median step "
        f"{result['median_step_ms']:.1f} ms, inter-token p99 {result['itl_p99_ms']:.1f} ms = "
        f"{result['itl_p99_over_median']:.2f} x (target <= 2)"
    )
    print(f"  plain batched forward, batch 32: {result['plain_forward_b32_tok_s']:.1f} tok/s (the hardware reference)")
    return 0


def measured_engine(args: argparse.Namespace, loaded, *, max_rows: int):
    """The engine a bench measures: the formats, attention and KV dtype asked for, compiled to the end
    (no budget: a bench times the compiled engine, not one still compiling)."""
    from aieng.engine.config import EngineConfig
    from aieng.engine.engine import Engine

    config = EngineConfig(
        compile=args.compile,
        weight_formats=args.weight_formats,
        decode_attention=args.decode_attention,
        kv_cache_dtype=args.kv_cache_dtype,
        max_rows=max_rows,
        compile_budget_s=None,
    )
    return Engine(loaded.model, loaded.tokenizer, context_length=loaded.context_length, config=config)


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


def engine(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng.bench.engine_bench import run_engine_bench
    from aieng.engine.config import EngineConfig

    loaded, label = load_for_bench(args)
    with tqdm(total=8 if args.compile else 6, desc="bench engine", unit="method", disable=args.json) as bar:
        result = run_engine_bench(
            loaded.model,
            loaded.tokenizer,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            label=label,
            engine_config=EngineConfig(
                compile=args.compile,
                quantize_int8=args.int8,
                weight_formats=args.weight_formats,
                decode_attention=args.decode_attention,
                kv_cache_dtype=args.kv_cache_dtype,
                compile_budget_s=None,
            ),
            progress=bar,
            memory=args.memory,
        )
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
        print(
            f"  compile speed-up     b1 {data['aieng_b1_tok_s'] / data['eager_b1_tok_s']:.2f}x, "
            f"b32 {data['aieng_b32_tok_s'] / data['eager_b32_tok_s']:.2f}x (against the eager loop, same run)"
        )
    for line in split_lines(data):
        print(line)
    return 0


def split_lines(data: dict) -> list[str]:
    """The batch-1 step's time by part, and the step as a share of the memory-bandwidth ceiling."""
    split = data["b1_split_ms"]
    lines = [f"  batch-1 decode step   {split['step']:.2f} ms:"]
    for part in ("layers", "output_projection", "sampling", "other"):
        ms = split[part]
        if ms is None:
            lines.append(f"    {part:19} (not timed apart: in layers)")
        else:
            lines.append(f"    {part:19} {ms:8.2f} ms  {ms / split['step']:6.1%}")
    mib = data["b1_step_bytes"] / 2**20
    if data["read_gb_s"]:
        ceiling = data["read_gb_s"] * 1e9 / data["b1_step_bytes"]
        lines.append(
            f"  memory limit          a step reads {mib:.0f} MiB of weights; at {data['read_gb_s']:.1f} GB/s "
            f"that is {ceiling:.0f} steps/s; this step reaches {data['b1_share_of_limit']:.0%} of it"
        )
    else:
        lines.append(
            f"  memory limit          a step reads {mib:.0f} MiB of weights (bandwidth not measured: --no-memory)"
        )
    return lines


def serve(args: argparse.Namespace) -> int:
    import logging
    import sys
    from datetime import datetime

    from tqdm import tqdm

    from aieng.bench.peers import parse_peers
    from aieng.bench.serve_bench import ServeBenchConfig, run_serve_bench
    from aieng.bench.serve_report import format_table
    from aieng.errors import ConfigError
    from aieng.settings import WEIGHT_FORMATS
    from aieng.store import ModelRef

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would bury the table
    logging.getLogger("gguf").setLevel(logging.WARNING)  # the GGUF writer's per-file INFO lines, likewise
    try:
        peers = parse_peers(args.peer, args.peer_format)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    formats = tuple(dict.fromkeys(f.strip() for f in args.weight_formats.split(",") if f.strip()))
    unknown = [f for f in formats if f not in WEIGHT_FORMATS]
    if unknown or not formats:
        raise ConfigError(f"--weight-formats {args.weight_formats!r}: choose from {', '.join(WEIGHT_FORMATS)}")
    store, ref, version, folder, tokenizer = verified_version(args)
    levels = tuple(int(c) for c in args.concurrency.split(","))
    config = ServeBenchConfig(
        concurrencies=levels,
        max_tokens=args.max_tokens,
        requests_per_level=args.requests,
        peers=tuple(peers),
        include_batching_off=not args.no_batching_off,
        measure_pss=not args.no_pss,
        metrics_overhead_rounds=args.metrics_overhead,
        peer_threads=args.peer_threads,
        gguf_cache=args.gguf_cache,
        peer_slots=settings_from(args).max_batch_size,
        include_aieng=not args.no_aieng,
        plain_forward=args.plain_forward,
        weight_formats=formats,
    )
    configs = (0 if args.no_aieng else len(formats) + (not args.no_batching_off)) + len(peers)
    total = configs * sum(max(args.requests, 2 * c) for c in levels) + 2 * args.metrics_overhead * max(
        args.requests, 64
    )
    with tqdm(total=total, desc="bench serve", unit="req", disable=args.json, file=sys.stderr) as bar:
        bench = run_serve_bench(
            store.root,
            f"{ref.name}@{version}",
            folder,
            tokenizer,
            config,
            progress=bar,
            log=lambda m: bar.write(m) if not args.json else None,
        )
    if args.save_baseline and 32 in bench.results.get("aieng", {}):
        m = bench.results["aieng"][32]
        store.update_manifest(
            ModelRef(ref.name, version),
            performance_baseline={
                "concurrency": 32,
                "max_tokens": args.max_tokens,
                "req_per_s": m["req_per_s"],
                "tokens_per_s": m["output_tok_per_s"],
                "latency_p50_s": m["latency_p50_s"],
                "latency_p99_s": m["latency_p99_s"],
                "ttft_p99_s": m["ttft_p99_s"],
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
    if args.json:
        print_json(
            {
                "results": bench.results,
                "pss": bench.pss,
                "metrics_overhead": bench.metrics_overhead,
                "plain_forward": bench.plain_forward,
                "peer_errors": bench.peer_errors,
                "peer_info": bench.peer_info,
                "targets": bench.targets,
            }
        )
    else:
        print(format_table(bench))
    return 0


def verified_version(args: argparse.Namespace):
    """The store, reference, version, folder and tokenizer of ``--model`` (or $AIENG_MODEL), its
    files' hashes checked: what a benchmark that starts servers on it needs first."""
    from transformers import AutoTokenizer

    from aieng.store import ModelRef, ModelStore, parse_ref

    settings = settings_from(args)
    store = ModelStore(settings.store)
    ref = parse_ref(args.model or settings.model)
    version = store.resolve(ref)
    folder = store.version_dir(ref.name, version)
    store.verify_or_raise(ModelRef(ref.name, version))
    return store, ref, version, folder, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def prefix(args: argparse.Namespace) -> int:
    import logging
    import sys

    from tqdm import tqdm

    from aieng.bench.prefix_bench import PrefixBenchConfig, check_fits, report, run_prefix_bench
    from aieng.errors import ConfigError
    from aieng.store.introspect import inspect_folder

    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = PrefixBenchConfig(args.system_tokens, args.users, args.turns, args.max_tokens, args.repeats)
    if min(config.system_tokens, config.users, config.turns, config.max_tokens, config.repeats) < 1:
        raise ConfigError("--system-tokens, --users, --turns, --max-tokens and --repeats are >= 1")
    store, ref, version, folder, tokenizer = verified_version(args)
    check_fits(config, inspect_folder(folder).context_length)
    total = 2 * (2 * config.repeats + 1) + 3 * config.users * config.turns
    with tqdm(total=total, desc="bench prefix", unit="req", disable=args.json) as bar:
        result = run_prefix_bench(
            store.root,
            f"{ref.name}@{version}",
            tokenizer,
            config,
            progress=bar.update,
            log=lambda message: tqdm.write(message, file=sys.stderr),
        )
    if args.json:
        print_json(result.to_dict())
    else:
        print("\n".join(report(result)))
    return 0


def memory(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng.bench.memory_bench import measure_bandwidth, report
    from aieng.errors import ConfigError

    if args.mib < 1 or args.repeats < 1 or (args.threads is not None and args.threads < 1):
        raise ConfigError("--mib, --repeats and --threads are >= 1")
    model = None
    if args.model:
        from aieng.store import ModelStore, parse_ref
        from aieng.store.introspect import inspect_folder

        folder = Path(args.model)
        if not folder.is_dir():
            folder = ModelStore(settings_from(args).store).path(parse_ref(args.model))
        model = (args.model, inspect_folder(folder).num_parameters)
    with tqdm(total=2, desc="bench memory", unit="reading", disable=args.json) as bar:
        result = measure_bandwidth(args.threads, args.mib, args.repeats, progress=lambda _: bar.update())
    if args.json:
        extra = {"model": model[0], "num_parameters": model[1]} if model else {}
        print_json({**result.to_dict(), **extra})
    else:
        print("\n".join(report(result, model)))
    return 0
