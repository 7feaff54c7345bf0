"""The verified model store: versions on disk, their manifests, and the `current` pointer.

Layout (docs/architecture.md, "The model store")::

    <store>/<name>/versions/<version>/   model files + manifest.json
    <store>/<name>/current -> versions/<version>
    <store>/<name>/history.jsonl
    <store>/<name>/canary.json           the version served beside current, and its weight (canary.py)
"""

from aieng.store.manifest import Manifest
from aieng.store.refs import ModelRef, parse_ref
from aieng.store.store import ModelStore, VerifyReport

__all__ = ["Manifest", "ModelRef", "ModelStore", "VerifyReport", "parse_ref"]
