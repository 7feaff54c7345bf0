"""Evaluate a store version and record the result in its manifest (``aieng eval``, runbooks).

Lives apart from the suite so the suite stays usable on any model object, store or not.
"""

from __future__ import annotations

from datetime import datetime, timezone

from aieng.evaluation.suite import evaluate
from aieng.loading.loader import LoadConfig, load_version
from aieng.store import ModelRef, ModelStore


def evaluate_version(store: ModelStore, ref: ModelRef, config: LoadConfig = LoadConfig(), *,
                     n_per_family: int = 50) -> dict:
    """Load ``ref`` (hash-verified), run the held-out suite, write ``eval`` into its manifest.

    Returns the manifest entry plus ``name`` and ``version``.
    """
    loaded = load_version(store, ref, config)
    report = evaluate(loaded.model, loaded.tokenizer, n_per_family=n_per_family)
    entry = {
        "suite": report.suite,
        "metrics": {"accuracy": report.accuracy, "perplexity": report.perplexity},
        "n_per_family": report.n_per_family,
        "seconds": round(report.seconds, 2),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    store.update_manifest(ModelRef(ref.name, loaded.version), eval=entry)
    return {"name": ref.name, "version": loaded.version, **entry}
