"""Evaluate a store version on an eval suite and record the result in its manifest (``aieng eval``,
runbooks, ``aieng demo install``).

The suite is the one given, else the one registered with the version (``eval-suite/`` in its
folder, hashed with its weights). Lives apart from the suite runner so that stays usable on any
model object, store or not.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from aieng.errors import StoreError, SuiteError
from aieng.evaluation.suite import EvalReport, evaluate, evaluate_server
from aieng.evaluation.suite_file import Suite, largest_family, load_suite
from aieng.loading.loader import LoadConfig, load_version
from aieng.store import ModelRef, ModelStore, parse_ref
from aieng.store.introspect import prompt_template

# None: full precision, recorded under ``eval``; the others under ``eval.variants.<name>`` with their
# delta: int8 dynamic quantization (``--int8``), bf16, int8 or int4 weights (``--dtype``), a
# bf16 KV cache (``--kv-cache-dtype``).
VARIANTS = (None, "int8", "bfloat16", "int8_weights", "int4_weights", "kv_bfloat16")
CHANGED_KEPT = 5  # a variant's agreement names this many of the cases whose answer changed


def suite_for(store: ModelStore, ref: ModelRef, suite: Suite | str | Path | None = None) -> Suite:
    """``suite`` (a Suite or a file), else the suite registered with ``ref``; SuiteError naming
    both ways to give one when there is none."""
    if isinstance(suite, Suite):
        return suite
    if suite is not None:
        return load_suite(suite)
    named = f"{ref.name}@{store.resolve(ref)}"
    registered = store.suite(parse_ref(named))
    if registered is None:
        raise SuiteError(
            f"{named} has no eval suite: pass one (`aieng eval {named} --suite FILE`, format in "
            "docs/evaluation.md), register the version with one (`aieng model register ... --suite FILE`), "
            f"or compare it with the current version (`aieng eval {named} --compare`)"
        )
    return registered


def _entry(report: EvalReport, template_sha256: str | None, where: str) -> dict:
    return {
        "suite": report.suite,
        "suite_sha256": report.suite_sha256,
        # The chat template the prompts were rendered with, so the gate can refuse a version whose
        # template is not the one its numbers were measured with.
        "template_sha256": template_sha256,
        "metrics": report.metrics(),
        "n_per_family": report.n_per_family,
        "where": where,  # "in process" or the server's URL
        "cases": report.cases,
        "seconds": round(report.seconds, 2),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def evaluate_version_at(
    store: ModelStore,
    ref: ModelRef,
    url: str,
    *,
    suite: Suite | str | Path | None = None,
    n_per_family: int | None = None,
    token: str | None = None,
    record: bool = False,
) -> dict:
    """Grade what the server at ``url`` answers for ``ref`` (its ``name@version``) on the suite.

    Kept in the manifest only with ``record`` (the gate's numbers are measured in process, on
    the verified weights; a server's answers are a check of the serving path)."""
    version = store.resolve(ref)
    chosen = suite_for(store, ref, suite)
    report = evaluate_server(url, f"{ref.name}@{version}", chosen, per_family=n_per_family, token=token)
    template = (prompt_template(store.version_dir(ref.name, version)) or {}).get("sha256")
    entry = _entry(report, template, url)
    if record:
        store.update_manifest(ModelRef(ref.name, version), eval=entry)
    return {"name": ref.name, "version": version, "mistakes": report.mistakes, **entry}


def evaluate_version(
    store: ModelStore,
    ref: ModelRef,
    config: LoadConfig = LoadConfig(),
    *,
    suite: Suite | str | Path | None = None,
    n_per_family: int | None = None,
    int8: bool = False,
    variant: str | None = None,
) -> dict:
    """Load ``ref`` (hash-verified), run the suite on its gate cases (at most ``n_per_family`` per
    family), write ``eval`` into its manifest.

    Returns the manifest entry plus ``name``, ``version`` and ``mistakes``. With ``int8`` the
    model is quantized first and the result goes to ``eval.variants.int8`` with its ``delta``
    against the recorded full-precision metrics (which must exist, be of the same suite and
    prompts, and are left as they are).
    """
    variant = variant or ("int8" if int8 else None)
    if variant not in VARIANTS:
        raise StoreError(f"unknown evaluation variant {variant!r}: use one of {', '.join(v for v in VARIANTS if v)}")
    chosen = suite_for(store, ref, suite)  # before loading: a missing suite costs no load
    loaded = load_version(store, ref, config.full_precision())
    model = loaded.model
    if variant:
        base = (loaded.manifest.eval or {}) if loaded.manifest else {}
        if "metrics" not in base:
            raise StoreError(
                f"{ref.name}@{loaded.version} has no recorded evaluation to compare {variant} against; "
                f"run `aieng eval {ref.name}@{loaded.version}` first"
            )
        if base.get("suite_sha256") != chosen.sha256:
            raise StoreError(
                f"the recorded evaluation of {ref.name}@{loaded.version} used suite {base.get('suite')} "
                f"({str(base.get('suite_sha256'))[:12]}), not {chosen.label} ({chosen.sha256[:12]}): "
                f"re-run `aieng eval {ref.name}@{loaded.version}` with this suite first"
            )
        if base.get("n_per_family") != largest_family(
            chosen.gate_cases(n_per_family)
        ):  # other prompts: the delta would be noise
            raise StoreError(
                f"the recorded evaluation of {ref.name}@{loaded.version} used {base.get('n_per_family')} "
                f"prompts per family; run the {variant} one with --n-per-family {base.get('n_per_family')} "
                f"(or re-run `aieng eval` with {n_per_family} first)"
            )
    if variant == "int8":
        from aieng.engine.quantize import quantize_int8

        model = quantize_int8(model)
    if variant in ("bfloat16", "int8_weights", "int4_weights"):
        from aieng.engine.native.quantized import quantized_linears
        from aieng.engine.native.weight_rounding import bf16_linears

        rounding = bf16_linears(model) if variant == "bfloat16" else quantized_linears(model, variant.split("_")[0])
        with rounding:
            report = evaluate(model, loaded.tokenizer, chosen, per_family=n_per_family)
    elif variant == "kv_bfloat16":
        from aieng.evaluation.kv_rounding import bf16_kv_rounding

        with bf16_kv_rounding(model):
            report = evaluate(model, loaded.tokenizer, chosen, per_family=n_per_family)
    else:
        report = evaluate(model, loaded.tokenizer, chosen, per_family=n_per_family)
    entry = _entry(report, (prompt_template(loaded.path) or {}).get("sha256"), "in process")
    if variant:
        metrics = base["metrics"]
        entry["delta"] = {
            "accuracy": {
                family: round(report.accuracy[family] - metrics["accuracy"].get(family, 0.0), 4)
                for family in report.accuracy
            },
            "perplexity": _delta(report.perplexity, metrics.get("perplexity")),
        }
        greedy = {case.id for case in chosen.gate_cases(n_per_family) if case.greedy}
        entry["agreement"] = same_answers(base.get("cases", []), report.cases, greedy)
        entry.pop("cases")  # the variant's numbers and delta; its answers are the base's question
        entry = {**base, "variants": {**base.get("variants", {}), variant: entry}}
        store.update_manifest(ModelRef(ref.name, loaded.version), eval=entry)
        return {
            "name": ref.name,
            "version": loaded.version,
            "variant": variant,
            "int8": variant == "int8",
            "mistakes": report.mistakes,
            **entry["variants"][variant],
        }
    if loaded.manifest and (loaded.manifest.eval or {}).get("variants"):
        entry["variants"] = loaded.manifest.eval["variants"]  # measured against the earlier numbers
    store.update_manifest(ModelRef(ref.name, loaded.version), eval=entry)
    return {"name": ref.name, "version": loaded.version, "mistakes": report.mistakes, **entry}


def same_answers(full: list[dict], rounded: list[dict], greedy: set[str]) -> dict:
    """The rounded model's greedy answers against full precision's, case by case (each as the
    manifest keeps it, its first ``ANSWER_KEPT_CHARS``): how many were compared, the share that are
    the same text, and the first ids that changed. What a rounding does to a model whose suite has
    no labels (a random-weight stand-in grades nothing, yet its answers can still move)."""
    kept = {case["id"]: case["answer"] for case in full if case["id"] in greedy}
    compared = [(case["id"], case["answer"] == kept[case["id"]]) for case in rounded if case["id"] in kept]
    changed = [case_id for case_id, same in compared if not same]
    share = round(1 - len(changed) / len(compared), 4) if compared else None
    return {"greedy_cases": len(compared), "same_answer": share, "changed": changed[:CHANGED_KEPT]}


def _delta(new: float | None, old: float | None) -> float | None:
    return None if new is None or old is None else round(new - old, 4)
