"""``aieng model inspect N[@V]``: what ``aieng serve`` would run for a version on this host, and why.

It does what a serving process does up to the point of serving (verify, load, the worker plan,
build the engine: the forward, the measured weight formats, the KV cache, the decode attention)
and prints the choices with the settings that override each. The numbers are this host's: the
weight formats are measured here (or taken from the plan a previous start measured, kept under
the compile cache) and the worker plan reads this host's cores and memory.
"""

from __future__ import annotations

import argparse
import sys


def add_inspect(verbs, parents) -> None:
    p = verbs.add_parser(
        "inspect",
        parents=parents,
        help="what `aieng serve` would choose for a version on this host (forward, weight formats, "
        "KV cache, attention, workers x threads), without serving",
        description="Verify and load N[@V] (N: the current version), build its engine as `aieng serve` "
        "does with the same settings (AIENG_* and the flags below), and print each choice "
        "the engine made and why. Takes as long as a server's load, plus the weight-format "
        "measurement on a host's first start (kept for the next).",
    )
    p.add_argument("ref", metavar="N[@V]")
    p.add_argument("--json", action="store_true", help="machine-readable output (the serving_plan log event's fields)")
    p.set_defaults(handler=_inspect)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _inspect(args: argparse.Namespace) -> int:
    from aieng.cli.common import print_json, settings_from

    settings = settings_from(args, model=args.ref)
    _say(f"inspecting {args.ref} in {settings.store}: verifying and loading")
    import torch

    from aieng.engine import Engine
    from aieng.engine.decisions import engine_decisions
    from aieng.loading.loader import LoadConfig, load_version
    from aieng.server.process.compile_cache import use_compile_cache
    from aieng.server.process.runtime import RuntimeConfig
    from aieng.server.process.serving_plan import ServingPlan
    from aieng.server.process.worker_plan import plan_for_model
    from aieng.store import ModelStore, parse_ref

    config = RuntimeConfig.from_settings(settings)
    if settings.compile:
        use_compile_cache(settings.compile_cache_dir)  # where serve keeps the measured format plan
    loaded = load_version(ModelStore(settings.store), parse_ref(args.ref), LoadConfig.from_settings(settings))
    workers = plan_for_model(settings, loaded)
    torch.set_num_threads(workers.torch_threads)  # the format plan is measured at a worker's thread count
    _say(f"building the engine with {workers.torch_threads} torch thread(s) (weight formats measured on first use)")
    engine = Engine(loaded.model, loaded.tokenizer, context_length=loaded.context_length, config=config.engine)
    plan = ServingPlan(loaded.name, loaded.version, engine_decisions(engine), workers)
    manifest = loaded.manifest
    facts = (
        {
            "architecture": manifest.architecture,
            "parameters": manifest.num_parameters,
            "dtype": manifest.dtype,
            "context_length": loaded.context_length,
        }
        if manifest
        else {}
    )
    if args.json:
        print_json({**facts, **plan.fields()})
        return 0
    if facts:
        print(
            f"{'architecture':16} {facts['architecture']}, {facts['parameters']:,} parameters, {facts['dtype']}, "
            f"{facts['context_length']} positions"
        )
    for line in plan.lines():
        print(line)
    return 0
