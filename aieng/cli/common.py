"""Helpers shared by the command modules."""

from __future__ import annotations

import json
import sys

from aieng.settings import Settings
from aieng.store import ModelStore


def settings_from(args, **overrides) -> Settings:
    return Settings.from_env(store=getattr(args, "store", None), **overrides)


def store_from(args) -> ModelStore:
    return ModelStore(settings_from(args).store)


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def store_option_parent():
    """Lets `--store` go after the subcommand too (`aieng model list --store X`)."""
    import argparse

    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--store", default=argparse.SUPPRESS, help="model store root (default: $AIENG_STORE or ./var/store)"
    )
    return parent
