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
    p.add_argument("--compile", action="store_true", help="torch.compile the aieng forward pass")
    p.add_argument("--int8", action="store_true", help="dynamic int8 quantization of Linear layers (CPU)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_engine)


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
    with tqdm(total=5, desc="bench engine", unit="method", disable=args.json) as bar:
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
    return 0
