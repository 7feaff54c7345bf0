"""The release gate: may a candidate version be promoted, judged on its recorded evaluation?

Pure: it reads two manifest ``eval`` entries (``{"suite", "metrics": {"accuracy": {family: rate},
"perplexity"}, "n_per_family", ...}``, as ``aieng.evaluation.record`` writes them) and returns a
decision; it touches no store, so the deploy runbook and the tests run the same rules on the
same numbers.

Each rule reports every family it fails, one message per failure, so a refused deploy says
everything that is wrong at once instead of one problem per re-run. Rules are plain functions
of ``(candidate, current, thresholds, current_version)`` returning messages: a new rule is one
more function in ``RULES``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Rates are ratios of counts; a float subtraction must not turn an exact tie into a failure.
_EPSILON = 1e-9


@dataclass(frozen=True)
class GateThresholds:
    # Families the product depends on: held-out exact match must reach ``min_accuracy`` on each.
    gate_families: tuple[str, ...] = ("reverse", "json")
    # The floor for those families (a rate in [0, 1]; reaching it exactly passes).
    min_accuracy: float = 0.9
    # How far any family may drop below the current version's rate (same suite only); exactly
    # this much passes. Small, because eval sets are fixed and greedy decoding is deterministic:
    # a drop is a real change of the model, not noise.
    max_regression: float = 0.05

    @classmethod
    def with_overrides(cls, **overrides) -> "GateThresholds":
        """The defaults with every non-None override applied (the runbook's optional parameters)."""
        values = {key: value for key, value in overrides.items() if value is not None}
        if "gate_families" in values:
            values["gate_families"] = tuple(values["gate_families"])
        return cls(**values)


@dataclass
class GateDecision:
    passed: bool
    failures: list[str] = field(default_factory=list)  # one message per failed rule and family
    regression_checked: bool = False  # False: no current eval of the same suite to compare against

    def to_dict(self) -> dict:
        return asdict(self)


def _percent(rate: float) -> str:
    return f"{rate * 100:g}%"


def floor_failures(candidate: dict, current: dict | None, thresholds: GateThresholds,
                   current_version: str | None) -> list[str]:
    """Gate families below ``min_accuracy``; a family the eval did not measure counts as 0."""
    accuracy = candidate["metrics"]["accuracy"]
    failures = []
    for family in thresholds.gate_families:
        rate = accuracy.get(family)
        if rate is None:
            failures.append(f"{family}: not measured (counts as 0%) < {_percent(thresholds.min_accuracy)}")
        elif rate < thresholds.min_accuracy - _EPSILON:
            failures.append(f"{family}: {rate:.1%} < {_percent(thresholds.min_accuracy)}")
    return failures


def regression_failures(candidate: dict, current: dict | None, thresholds: GateThresholds,
                        current_version: str | None) -> list[str]:
    """Families that drop more than ``max_regression`` below the current version's eval.

    Only against an eval of the same suite: rates from different prompt sets are not comparable.
    """
    if not _comparable(candidate, current):
        return []
    accuracy = candidate["metrics"]["accuracy"]
    label = f"current {current_version}" if current_version else "current version"
    failures = []
    for family, old in current["metrics"]["accuracy"].items():
        new = accuracy.get(family, 0.0)
        if new < old - thresholds.max_regression - _EPSILON:
            failures.append(f"{family}: {new:.1%} regresses from {old:.1%} ({label})")
    return failures


RULES = (floor_failures, regression_failures)


def release_gate(candidate_eval: dict, current_eval: dict | None = None,
                 thresholds: GateThresholds = GateThresholds(), *, current_version: str | None = None) -> GateDecision:
    """Judge ``candidate_eval`` against ``thresholds`` and, when comparable, ``current_eval``.

    ``current_eval`` is the serving version's recorded eval (None when there is none, or when
    the candidate is the current version); ``current_version`` names it in the messages.
    """
    if "accuracy" not in (candidate_eval or {}).get("metrics", {}):
        raise ValueError("the candidate has no recorded accuracy (metrics.accuracy): evaluate it first")
    failures = [message for rule in RULES
                for message in rule(candidate_eval, current_eval, thresholds, current_version)]
    return GateDecision(passed=not failures, failures=failures,
                        regression_checked=_comparable(candidate_eval, current_eval))


def _comparable(candidate: dict, current: dict | None) -> bool:
    return bool(current) and "accuracy" in current.get("metrics", {}) and current.get("suite") == candidate.get("suite")
