"""``aieng demo ...``: build the offline demo model, and install it into the store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aieng.cli.common import settings_from, store_option_parent
from aieng.demo.shapes import SHAPES  # the registry only: importing it loads no torch

STORE = store_option_parent()


def add_parser(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="build the offline demo model (a small Llama trained from scratch)",
        description="The demo model is trained from nothing, offline, deterministically by seed.",
    )
    verbs = demo.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser(
        "build",
        parents=[STORE],
        help="generate the corpus, train the tokenizer and the model, save in HF format "
        "(--shape: untrained, for benchmarks)",
        description="Build the demo model into --out (must not exist or be empty). "
        "Takes minutes on CPU with the default step count; the folder's "
        "demo_build.json records how long this build took. With --shape nothing is "
        "trained: seconds, and a model only good for measuring speed and memory.",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output folder (default var/build/demo-seed<SEED>, or var/build/<SHAPE>-seed<SEED> with --shape)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the corpus and training, or with --shape the weights")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the shipped demo's)")
    p.add_argument(
        "--shape",
        choices=list(SHAPES),
        default=None,
        metavar="NAME",
        help="instead of training, write random weights in a named shape with the demo tokenizer, in "
        "seconds: a performance stand-in for benchmarks and tests whose outputs are noise. "
        "NAME is one of: " + " ".join(f"'{name}', {shape.about}." for name, shape in SHAPES.items()),
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_build)

    p = verbs.add_parser(
        "install",
        parents=[STORE],
        help="build, register, evaluate and promote the demo unless the store has one",
        description="Idempotent set-up used by `make serve` and `make test`: if NAME already has a "
        "current version, do nothing; otherwise build (or reuse a finished build), "
        "register as NAME@VERSION, run `aieng eval` into its manifest, and promote it "
        "through the release gate (whose default thresholds the demo passes on any CPU).",
    )
    p.add_argument("--name", default="demo")
    p.add_argument("--version", default="1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None)
    p.set_defaults(handler=_install)


def _config(seed: int, steps: int | None):
    from aieng.demo.build import DemoBuildConfig

    config = DemoBuildConfig(seed=seed)
    if steps is not None:
        from dataclasses import replace

        config = replace(config, steps=steps)
    return config


def _build(args: argparse.Namespace) -> int:
    if args.shape is not None:
        return _build_shape(args)
    from aieng.demo.build import build_demo_model

    out = Path(args.out or f"var/build/demo-seed{args.seed}")
    path = build_demo_model(out, _config(args.seed, args.steps), progress=not args.no_progress)
    print(f"demo model written to {path}; register it with: aieng model register {path} --name demo --version 1")
    return 0


def _build_shape(args: argparse.Namespace) -> int:
    if args.steps is not None:
        print(
            "aieng: error: --steps trains the demo model and --shape builds untrained weights: use one of them",
            file=sys.stderr,
        )
        return 2
    from aieng.demo.shapes import build_shape_model

    out = Path(args.out or f"var/build/{args.shape}-seed{args.seed}")
    path = build_shape_model(out, args.shape, seed=args.seed, progress=not args.no_progress)
    print(
        f"{args.shape} stand-in (random weights: its outputs are noise) written to {path}; register it with: "
        f"aieng model register {path} --name {args.shape} --version 1"
    )
    return 0


def _install(args: argparse.Namespace) -> int:
    from aieng.store import ModelRef, ModelStore

    settings = settings_from(args)
    store = ModelStore(settings.store)
    if args.name in store.names() and store.current(args.name):  # every make serve/test asks: answer before torch
        print(f"{args.name}@{store.current(args.name)} is already current in {store.root}; nothing to do")
        return 0
    from aieng.demo.build import build_demo_model
    from aieng.demo.heldout_suite import SUITE_FILE as HELDOUT_SUITE_FILE
    from aieng.evaluation.record import evaluate_version
    from aieng.loading.loader import LoadConfig

    if args.version not in store.versions(args.name):
        suffix = "" if args.steps is None else f"-steps{args.steps}"
        build_dir = Path("var/build") / f"demo-seed{args.seed}{suffix}"
        if not (build_dir / "config.json").is_file():  # builds are atomic: a config means a finished build
            build_demo_model(build_dir, _config(args.seed, args.steps))
        # The held-out suite by name, not only the build's copy: a build made before suites were
        # files has none, and the gate's thresholds live in the suite.
        store.register(
            build_dir,
            args.name,
            args.version,
            provenance=f"aieng demo build --seed {args.seed}",
            suite=HELDOUT_SUITE_FILE,
        )
        print(f"registered {args.name}@{args.version} with eval suite {HELDOUT_SUITE_FILE.name}")
    ref = ModelRef(args.name, args.version)
    registered = store.manifest(ref).suite
    evaluate_version(store, ref, LoadConfig.from_settings(settings), suite=None if registered else HELDOUT_SUITE_FILE)
    from aieng.release.promotion import promote

    promote(store, args.name, args.version, reason="initial install of the demo model")  # through the gate
    print(f"gate passed; promoted {args.name}@{args.version}; serve it with: aieng serve")
    return 0
