"""The release gate: may a candidate version replace the current one, judged on what was measured?

Pure: it reads what two versions' manifests recorded (``Evidence``: the ``eval`` entry as
``aieng.evaluation.record`` writes it, the ``performance_baseline`` from ``aieng bench serve
--save-baseline``, the chat template's sha256) and returns a decision; it touches no store, so
``aieng model promote``, ``aieng demo install``, the deploy runbook and the tests run the same
rules on the same numbers.

Every rule reports every failure it finds, each tagged with the rule's name, so a refused
promote says everything that is wrong at once instead of one problem per re-run. Rules are plain
functions of ``(candidate, current, thresholds)`` returning messages: a new rule is one more
entry in ``RULES``.

Rules:
- ``floor``: each gate family reaches ``min_accuracy`` (absolute, per family).
- ``regression``: no family drops more than ``max_regression`` below the current version's rate.
- ``perplexity``: perplexity at most ``max_perplexity`` (absolute ceiling) and at most
  ``1 + max_perplexity_rise`` times the current version's.
- ``template``: the candidate's chat template is the one its evaluation was measured with.
- ``performance``: when both versions carry a baseline of the same load, throughput does not fall
  by more than ``max_throughput_drop`` and p99 latency does not grow beyond ``max_latency_ratio``.

Comparisons with the current version need the same suite (eval) or the same load (baseline):
numbers measured on different prompts or loads are not comparable, and the decision says which
comparisons it could make (``compared``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Rates are ratios of counts; a float subtraction must not turn an exact tie into a failure.
_EPSILON = 1e-9


@dataclass(frozen=True)
class GateThresholds:
    # Families the product depends on: held-out exact match must reach ``min_accuracy`` on each.
    gate_families: tuple[str, ...] = ("reverse", "json")
    # The floor for those families (a rate in [0, 1]; reaching it exactly passes). 0.8, not
    # higher, because the demo build's scores vary by CPU (``aieng eval`` records each build's in
    # its manifest) and ``aieng demo install`` must pass on any machine; an untrained or broken
    # model scores near 0, far below it.
    min_accuracy: float = 0.8
    # How far any family may drop below the current version's rate (same suite only); exactly
    # this much passes. Small, because eval sets are fixed and greedy decoding is deterministic:
    # a drop is a real change of the model, not noise.
    max_regression: float = 0.05
    # Perplexity of the reference answers: an absolute ceiling (None: none) and the largest rise
    # over the current version's, as a fraction (0.25: at most 1.25x; ``aieng eval`` records it).
    max_perplexity: float | None = 2.0
    max_perplexity_rise: float = 0.25
    # Against the current version's performance baseline (same concurrency and max tokens).
    max_throughput_drop: float = 0.2  # candidate tokens/s >= (1 - this) x current
    max_latency_ratio: float = 1.5  # candidate p99 latency <= this x current

    @classmethod
    def with_overrides(cls, **overrides) -> GateThresholds:
        """The defaults with every non-None override applied (CLI flags, runbook parameters)."""
        values = {key: value for key, value in overrides.items() if value is not None}
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown gate thresholds {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        if "gate_families" in values:
            values["gate_families"] = tuple(values["gate_families"])
        return cls(**values)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["gate_families"] = list(self.gate_families)
        return data


@dataclass(frozen=True)
class Evidence:
    """What one version's manifest recorded, as far as the gate reads it."""

    version: str | None
    eval: dict | None
    performance_baseline: dict | None = None
    template_sha256: str | None = None  # the chat template the version ships (manifest.prompt_template)

    @classmethod
    def of(cls, manifest) -> Evidence:
        template = (manifest.prompt_template or {}).get("sha256")
        return cls(manifest.version, manifest.eval, manifest.performance_baseline, template)


@dataclass
class GateDecision:
    passed: bool
    failures: list[dict] = field(default_factory=list)  # {"rule", "message"}, every failure of every rule
    compared: dict = field(default_factory=dict)  # which comparisons with the current version were possible

    @property
    def messages(self) -> list[str]:
        return [f"{f['rule']}: {f['message']}" for f in self.failures]

    @property
    def rules_fired(self) -> list[str]:
        return list(dict.fromkeys(f["rule"] for f in self.failures))

    def to_dict(self) -> dict:
        return asdict(self)


def _percent(rate: float) -> str:
    return f"{rate * 100:g}%"


def _label(current: Evidence) -> str:
    return f"current {current.version}" if current.version else "current version"


def floor_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """Gate families below ``min_accuracy``; a family the eval did not measure counts as 0."""
    accuracy = candidate.eval["metrics"]["accuracy"]
    failures = []
    for family in thresholds.gate_families:
        rate = accuracy.get(family)
        if rate is None:
            failures.append(f"{family}: not measured (counts as 0%) < {_percent(thresholds.min_accuracy)}")
        elif rate < thresholds.min_accuracy - _EPSILON:
            failures.append(f"{family}: {rate:.1%} < {_percent(thresholds.min_accuracy)}")
    return failures


def regression_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """Families that drop more than ``max_regression`` below the current version's eval."""
    if not _same_suite(candidate, current):
        return []
    accuracy = candidate.eval["metrics"]["accuracy"]
    failures = []
    for family, old in current.eval["metrics"]["accuracy"].items():
        new = accuracy.get(family, 0.0)
        if new < old - thresholds.max_regression - _EPSILON:
            failures.append(f"{family}: {new:.1%} regresses from {old:.1%} ({_label(current)})")
    return failures


def perplexity_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """Perplexity above the ceiling, or risen too far over the current version's."""
    value = candidate.eval["metrics"].get("perplexity")
    if value is None:
        return ["not measured: re-run `aieng eval`"]
    failures = []
    if thresholds.max_perplexity is not None and value > thresholds.max_perplexity + _EPSILON:
        failures.append(f"{value:.3f} > ceiling {thresholds.max_perplexity:g}")
    old = current.eval["metrics"].get("perplexity") if _same_suite(candidate, current) else None
    if old and value > old * (1 + thresholds.max_perplexity_rise) + _EPSILON:
        failures.append(
            f"{value:.3f} rises more than {_percent(thresholds.max_perplexity_rise)} over {old:.3f} ({_label(current)})"
        )
    return failures


def template_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """The eval must have been measured with the chat template the version serves with."""
    measured = candidate.eval.get("template_sha256")
    if candidate.template_sha256 is None and measured is None:
        return []  # a model without a chat template: nothing to tie
    if measured is None:
        return ["the evaluation does not record which chat template it used: re-run `aieng eval`"]
    if measured != candidate.template_sha256:
        return [
            f"the chat template changed since the evaluation (evaluated with {measured[:12]}, "
            f"ships {str(candidate.template_sha256)[:12]}): re-run `aieng eval`"
        ]
    return []


def performance_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """Throughput and p99 latency against the current version's baseline under the same load."""
    if not _same_load(candidate, current):
        return []
    new, old = candidate.performance_baseline, current.performance_baseline
    failures = []
    if new["tokens_per_s"] < old["tokens_per_s"] * (1 - thresholds.max_throughput_drop) - _EPSILON:
        failures.append(
            f"{new['tokens_per_s']:.1f} tokens/s drops more than {_percent(thresholds.max_throughput_drop)} "
            f"below {old['tokens_per_s']:.1f} ({_label(current)})"
        )
    if new["latency_p99_s"] > old["latency_p99_s"] * thresholds.max_latency_ratio + _EPSILON:
        failures.append(
            f"p99 latency {new['latency_p99_s']:.3f} s > {thresholds.max_latency_ratio:g} x "
            f"{old['latency_p99_s']:.3f} s ({_label(current)})"
        )
    return failures


RULES = {
    "floor": floor_failures,
    "regression": regression_failures,
    "perplexity": perplexity_failures,
    "template": template_failures,
    "performance": performance_failures,
}


def release_gate(
    candidate: Evidence, current: Evidence | None = None, thresholds: GateThresholds = GateThresholds()
) -> GateDecision:
    """Judge ``candidate`` against ``thresholds`` and, where comparable, the ``current`` version
    (None when there is none, or when the candidate is the current version)."""
    if "accuracy" not in (candidate.eval or {}).get("metrics", {}):
        raise ValueError(
            f"{candidate.version or 'the candidate'} has no recorded accuracy (metrics.accuracy): "
            "evaluate it first with `aieng eval`"
        )
    failures = [
        {"rule": name, "message": message}
        for name, rule in RULES.items()
        for message in rule(candidate, current, thresholds)
    ]
    compared = {"eval": _same_suite(candidate, current), "performance": _same_load(candidate, current)}
    return GateDecision(passed=not failures, failures=failures, compared=compared)


def _same_suite(candidate: Evidence, current: Evidence | None) -> bool:
    return (
        current is not None
        and "accuracy" in (current.eval or {}).get("metrics", {})
        and current.eval.get("suite") == candidate.eval.get("suite")
    )


def _same_load(candidate: Evidence, current: Evidence | None) -> bool:
    if current is None or not candidate.performance_baseline or not current.performance_baseline:
        return False
    keys = ("concurrency", "max_tokens")
    return all(candidate.performance_baseline.get(k) == current.performance_baseline.get(k) for k in keys)
