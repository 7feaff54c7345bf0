"""``aieng bench ...``: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import argparse
from pathlib import Path

from aieng.cli import bench_run
from aieng.cli.common import store_option_parent
from aieng.settings import WEIGHT_FORMATS

STORE = store_option_parent()


def add_parser(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks (engine against transformers, ...)",
        description="Benchmarks compare side by side in one process and report ratios.",
    )
    kinds = bench.add_subparsers(dest="kind", metavar="KIND", required=True)
    p = kinds.add_parser(
        "engine",
        parents=[STORE],
        help="tokens/s: transformers pipeline and generate() vs the aieng loop at batch 1, 8, 32",
        description="Same model, same prompts, greedy, a fixed number of new tokens (EOS ignored), "
        "warm-ups excluded, median over --repeats. Targets on the demo model: "
        "ratio_vs_generate >= 1.4, ratio_vs_pipeline >= 1.5, b32 >= 8 x b1. Then where a batch-1 decode step "
        "goes (layers, output projection over the vocabulary, sampling, other) and, with --memory, the step "
        "as a share of the read-bandwidth ceiling for the bytes of weights it reads.",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="PATH|N[@V]",
        help="a model folder or a store reference (default: $AIENG_MODEL)",
    )
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch.compile the aieng forward (prefill and decode), as `aieng serve` does by default (on); the eager "
        "loop is measured too, in the same run, and reported as eager_*",
    )
    p.add_argument("--int8", action="store_true", help="dynamic int8 quantization of Linear layers (CPU)")
    p.add_argument(
        "--weight-formats",
        choices=list(FORMATS),
        default="auto",
        help="as AIENG_WEIGHT_FORMATS for `aieng serve`: auto measures at which step sizes bf16 weights "
        "beat fp32 on this CPU and from which size oneDNN-packed copies win (default auto, what the "
        "server runs)",
    )
    _attention_options(p)
    p.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the read bandwidth (as aieng bench memory) and say the batch-1 decode step as a "
        "share of its ceiling (default on; a few seconds)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=bench_run.engine)

    p = kinds.add_parser(
        "serve",
        parents=[STORE],
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
        "--plain-forward --concurrency 1,32 --max-tokens 64.",
    )
    p.add_argument("--model", default=None, metavar="N[@V]", help="store reference (default: $AIENG_MODEL)")
    p.add_argument(
        "--peer",
        action="append",
        default=None,
        metavar="NAME[,NAME]",
        help="a server to measure beside aieng, repeatable or comma-separated: transformers, llama.cpp, "
        "llama-cpp-python; a GGUF peer may name its format: llama.cpp:q8_0",
    )
    p.add_argument(
        "--peer-format",
        default="f32",
        metavar="FMT[,FMT]",
        help="GGUF weights for the llama.cpp peers, comma-separated: f32 (exact), bf16 (as aieng's bf16 "
        "steps), q8_0, q4_0 (default f32); compare aieng's formats with the same ones: bf16 with bf16, "
        "int8 with q8_0, int4 with q4_0",
    )
    p.add_argument(
        "--weight-formats",
        default="auto",
        metavar="FMT[,FMT]",
        help="aieng servers to measure, one per AIENG_WEIGHT_FORMATS value, comma-separated (default auto, "
        "what `aieng serve` runs); each after the first is reported as aieng_FMT, e.g. auto,int8 beside "
        "--peer-format bf16,q8_0",
    )
    p.add_argument(
        "--peer-threads",
        type=int,
        default=0,
        metavar="N",
        help="compute threads of the llama.cpp peers (default: the torch threads one aieng worker gets here)",
    )
    p.add_argument(
        "--gguf-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="where GGUF conversions are kept, by model hash (default ~/.cache/aieng/gguf)",
    )
    p.add_argument("--no-aieng", action="store_true", help="measure the peers alone (no aieng server, no PSS)")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated client counts")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=64, help="requests per level (at least 2 x C)")
    p.add_argument("--no-batching-off", action="store_true", help="skip the max_batch_size=1 run")
    p.add_argument("--no-pss", action="store_true", help="skip the PSS measurement")
    p.add_argument(
        "--plain-forward",
        action="store_true",
        help="also time transformers' plain batched forward at batch 32 in this process once the servers "
        "have stopped (the hardware's reference rate) and report aieng's C=32 share of it (target >= 0.8)",
    )
    p.add_argument(
        "--metrics-overhead",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also measure the cost of Prometheus metrics: servers with AIENG_METRICS=1 and =0 driven in "
        "ROUNDS alternating rounds at C=32 (p50 latency and server CPU per request)",
    )
    p.add_argument(
        "--save-baseline",
        action="store_true",
        help="write the C=32 numbers into the model version's manifest as performance_baseline",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=bench_run.serve)

    p = kinds.add_parser(
        "context",
        parents=[STORE],
        help="long context: decode step at KV 64 vs 1,256, and streams' inter-token p99 while a "
        "1,000-token prompt joins (chunked prefill)",
        description="On the engine alone (no HTTP), median over --repeats, runs alternated: the "
        "decode step of --batch rows at KV length 64 and at 1,256 (target ratio <= 1.3), "
        "then --streams rows decoding while a --join-tokens prompt joins (target: their "
        "inter-token p99 <= 2 x the median step). Also the plain batched forward's "
        "decode rate at batch 32 (transformers' forward alone) as the hardware reference.",
    )
    _engine_bench_options(p, batch=1, repeats=3)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--join-tokens", type=int, default=1000)
    p.set_defaults(handler=bench_run.context)

    p = kinds.add_parser(
        "grammar",
        parents=[STORE],
        help="constrained decoding: the masks' cost at batch 32, and JSON validity and accuracy free vs constrained",
        description="On the engine alone (no HTTP). Cost: --batch rows decode --new-tokens each, free "
        "and under a JSON schema they cannot complete in that budget (forced: every row "
        "masked every step), alternated, median over --repeats (target: <= 15% of decode "
        "throughput); with --json-task also held-out json prompts under their own "
        "schemas (json_task: the model mostly agrees). Effect (--json-task, on "
        "the demo model): its held-out json prompts free, with json_object and with a "
        "schema per prompt, greedy and sampled at temperature 1.",
    )
    _engine_bench_options(p, batch=32, repeats=5)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument(
        "--json-task",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure validity and accuracy on the demo's json prompts (default: on for a model whose "
        "name starts with demo)",
    )
    p.set_defaults(handler=bench_run.grammar)
    add_memory_parser(kinds)
    add_prefix_parser(kinds)


FORMATS = WEIGHT_FORMATS


def add_memory_parser(kinds) -> None:
    p = kinds.add_parser(
        "memory",
        parents=[STORE],
        help="read bandwidth: the ceiling of a batch-1 decode step, and how much of it torch's bf16 matvec reaches",
        description="A sum over a buffer far larger than the caches (the machine's read bandwidth with "
        "torch's threads) and the bf16 matrix-vector product of a batch-1 linear layer over a weight "
        "of the same size, median over --repeats. With --model: the most tokens/s a batch-1 step "
        "reading that model's weights can reach here, per weight format (aieng.bench.memory_bench).",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's count)")
    p.add_argument("--mib", type=int, default=512, help="buffer size in MiB (default 512)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--model", default=None, metavar="PATH|N[@V]", help="a model folder or a store reference")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=bench_run.memory)


def add_prefix_parser(kinds) -> None:
    p = kinds.add_parser(
        "prefix",
        parents=[STORE],
        help="the prefix cache on chat traffic: TTFT of a hit vs a miss, and a many-user chat workload "
        "with one system prompt, cache on vs off",
        description="Starts the server twice on loopback, with AIENG_PREFIX_CACHE=1 and =0, each "
        "measured once compiled. Time to first token one request at a time, alternating a hit "
        "(the shared --system-tokens system prompt and a new question) with a miss (a system prompt "
        "of the same length never sent before), --repeats each (target: hit p50 <= 0.2 x miss p50). "
        "Then --users conversations at once, --turns turns each (the system prompt, the conversation "
        "so far, a new question), greedy, --max-tokens per answer with EOS ignored: requests/s on vs "
        "off (target: at least twice), the share of prompt tokens read from the cache, and every answer "
        "compared: the cache may change no more greedy answers than running the workload again on "
        "the same server does (it runs twice there). The conversations must fit the model's context.",
    )
    p.add_argument("--model", default=None, metavar="N[@V]", help="store reference (default: $AIENG_MODEL)")
    p.add_argument("--system-tokens", type=int, default=1000, help="the shared system prompt's length (default 1000)")
    p.add_argument("--users", type=int, default=16, help="conversations at once (default 16)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (default 4)")
    p.add_argument("--max-tokens", type=int, default=16, help="new tokens per answer (default 16)")
    p.add_argument("--repeats", type=int, default=5, help="hits and misses each for the TTFT (default 5)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=bench_run.prefix)


def _attention_options(p) -> None:
    p.add_argument(
        "--decode-attention",
        choices=["auto", "sdpa"],
        default="auto",
        help="as AIENG_DECODE_ATTENTION: auto = aieng's CPU kernel (when it builds), sdpa = PyTorch's",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "model", "bfloat16"],
        default="auto",
        help="as AIENG_KV_CACHE_DTYPE (default auto, as the server)",
    )


def _engine_bench_options(p, *, batch: int, repeats: int) -> None:
    """What every engine-only benchmark takes: the model, the batch, repeats, the serving settings."""
    p.add_argument("--model", default=None, metavar="PATH|N[@V]", help="a model folder or a store reference")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--weight-formats", choices=list(FORMATS), default="auto")
    _attention_options(p)
    p.add_argument("--json", action="store_true")
