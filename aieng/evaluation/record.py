"""Evaluate a store version and record the result in its manifest (``aieng eval``, runbooks).

Lives apart from the suite so the suite stays usable on any model object, store or not.
"""

from __future__ import annotations

from datetime import UTC, datetime

from aieng.errors import StoreError
from aieng.evaluation.suite import evaluate
from aieng.loading.loader import LoadConfig, load_version
from aieng.store import ModelRef, ModelStore
from aieng.store.introspect import prompt_template

# None: full precision, recorded under ``eval``; the others under ``eval.variants.<name>`` with their
# delta: int8 dynamic quantization, bf16 weights (``--dtype``), a bf16 KV cache (``--kv-cache-dtype``).
VARIANTS = (None, "int8", "bfloat16", "kv_bfloat16")


def evaluate_version(
    store: ModelStore,
    ref: ModelRef,
    config: LoadConfig = LoadConfig(),
    *,
    n_per_family: int = 50,
    int8: bool = False,
    variant: str | None = None,
) -> dict:
    """Load ``ref`` (hash-verified), run the held-out suite, write ``eval`` into its manifest.

    Returns the manifest entry plus ``name`` and ``version``. With ``int8`` the model is
    quantized first and the result goes to ``eval.variants.int8`` with its ``delta`` against the
    recorded full-precision metrics (which must exist and are left as they are).
    """
    variant = variant or ("int8" if int8 else None)
    if variant not in VARIANTS:
        raise StoreError(f"unknown evaluation variant {variant!r}: use one of {', '.join(v for v in VARIANTS if v)}")
    loaded = load_version(store, ref, config)
    model = loaded.model
    if variant:
        base = (loaded.manifest.eval or {}) if loaded.manifest else {}
        if "metrics" not in base:
            raise StoreError(
                f"{ref.name}@{loaded.version} has no recorded evaluation to compare int8 against; "
                f"run `aieng eval {ref.name}@{loaded.version}` first"
            )
        if base.get("n_per_family") != n_per_family:  # different prompt sets: the delta would be sampling noise
            raise StoreError(
                f"the recorded evaluation of {ref.name}@{loaded.version} used {base.get('n_per_family')} "
                f"prompts per family; run the int8 one with --n-per-family {base.get('n_per_family')} "
                f"(or re-run `aieng eval` with {n_per_family} first)"
            )
    if variant == "int8":
        from aieng.engine.quantize import quantize_int8

        model = quantize_int8(model)
    if variant == "bfloat16":
        from aieng.engine.native.formats import bf16_linears

        with bf16_linears(model):
            report = evaluate(model, loaded.tokenizer, n_per_family=n_per_family)
    elif variant == "kv_bfloat16":
        from aieng.evaluation.kv_rounding import bf16_kv_rounding

        with bf16_kv_rounding(model):
            report = evaluate(model, loaded.tokenizer, n_per_family=n_per_family)
    else:
        report = evaluate(model, loaded.tokenizer, n_per_family=n_per_family)
    entry = {
        "suite": report.suite,
        # The chat template the prompts were rendered with, so the gate can refuse a version whose
        # template is not the one its numbers were measured with.
        "template_sha256": (prompt_template(loaded.path) or {}).get("sha256"),
        "metrics": {"accuracy": report.accuracy, "perplexity": report.perplexity},
        "n_per_family": report.n_per_family,
        "seconds": round(report.seconds, 2),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if variant:
        metrics = base["metrics"]
        entry["delta"] = {
            "accuracy": {
                family: round(report.accuracy[family] - metrics["accuracy"].get(family, 0.0), 4)
                for family in report.accuracy
            },
            "perplexity": round(report.perplexity - metrics["perplexity"], 4),
        }
        entry = {**base, "variants": {**base.get("variants", {}), variant: entry}}
        store.update_manifest(ModelRef(ref.name, loaded.version), eval=entry)
        return {
            "name": ref.name,
            "version": loaded.version,
            "variant": variant,
            "int8": variant == "int8",
            **entry["variants"][variant],
        }
    if loaded.manifest and (loaded.manifest.eval or {}).get("variants"):
        entry["variants"] = loaded.manifest.eval["variants"]  # measured against the earlier numbers
    store.update_manifest(ModelRef(ref.name, loaded.version), eval=entry)
    return {"name": ref.name, "version": loaded.version, **entry}
