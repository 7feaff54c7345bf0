"""Small conveniences for the notebooks and runbooks, so they hold no logic of their own.

Notebooks run with their own folder as the working directory (JupyterLab, nbval, papermill),
so relative defaults like ``var/store`` must be resolved against the project root.
"""

from __future__ import annotations

import os
from pathlib import Path

from aieng.store import ModelRef, ModelStore

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def store_root() -> Path:
    """``$AIENG_STORE`` if set, else ``<project>/var/store``."""
    configured = os.environ.get("AIENG_STORE")
    if configured:
        return Path(configured)
    return PROJECT_ROOT / "var" / "store"


def default_store() -> ModelStore:
    return ModelStore(store_root())


def demo_model_dir(name: str = "demo") -> Path:
    """The folder of the store's current demo version (``make serve``/``make test`` install it)."""
    store = default_store()
    try:
        return store.path(ModelRef(name))
    except Exception as exc:
        raise RuntimeError(
            f"no current {name!r} model in {store.root}: run `make demo` (or `aieng demo install`) first"
        ) from exc
