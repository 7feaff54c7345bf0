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

Thresholds come from the suite registered with the candidate (``GateThresholds.from_suite``),
overridden by flags or runbook parameters.

Rules:
- ``evidence``: the candidate was graded by a labelled suite, or its answers were compared with
  the current version's (``aieng eval --compare``); a model with neither needs ``--force``.
- ``suite``: the grades come from the suite registered with the version.
- ``comparison``: against the current version's greedy answers: agreement, length ratio, empty
  and refused answers, perplexity of the current answers under the candidate.
- ``floor``: each family with a floor reaches it (absolute, per family).
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

from dataclasses import asdict, dataclass, field, replace

# Rates are ratios of counts; a float subtraction must not turn an exact tie into a failure.
_EPSILON = 1e-9


@dataclass(frozen=True)
class GateThresholds:
    """Every threshold the gate applies. A version's own come from the suite registered with it
    (``thresholds`` in the suite file, read by :meth:`from_suite`); flags and runbook parameters
    override them (:meth:`replaced`). The defaults are for a suite that sets none."""

    # Minimum weighted pass rate per family (reaching it exactly passes). None of the defaults:
    # which families matter, and how much, is the suite's to say.
    floors: dict = field(default_factory=dict)
    # How far any family may drop below the current version's rate (same suite only); exactly
    # this much passes. Small, because suites are fixed and greedy decoding is deterministic: a
    # drop is a real change of the model, not noise.
    max_regression: float = 0.05
    # Perplexity: an absolute ceiling (None: none) and the largest rise over the current
    # version's, as a fraction (0.25: at most 1.25x).
    max_perplexity: float | None = None
    max_perplexity_rise: float = 0.25
    # Against the current version's performance baseline (same concurrency and max tokens).
    max_throughput_drop: float = 0.2  # candidate tokens/s >= (1 - this) x current
    max_latency_ratio: float = 1.5  # candidate p99 latency <= this x current
    # The comparison with the current version's answers (``aieng eval --compare``), for models
    # whose suite has no labels: greedy answers that agree, of similar length, no more empty or
    # refused, and the current answers not much less likely under the candidate. An exact copy
    # scores 1, 1, 0, 0, 1.
    min_agreement: float = 0.9
    min_length_ratio: float = 0.8
    max_length_ratio: float = 1.25
    max_empty_rise: float = 0.05
    max_refusal_rise: float = 0.05
    max_perplexity_ratio: float = 1.25

    @classmethod
    def from_suite(cls, thresholds: dict | None) -> GateThresholds:
        """The thresholds a suite file sets (its ``thresholds`` mapping), the defaults elsewhere."""
        values = dict(thresholds or {})
        values.update(values.pop("comparison", {}) or {})
        return cls().replaced(**values)

    def replaced(self, *, gate_families=None, min_accuracy=None, **overrides) -> GateThresholds:
        """These thresholds with every non-None override applied (CLI flags, runbook parameters).

        ``gate_families`` replaces the families that have a floor (each at ``min_accuracy``,
        else its floor so far, else 0.8); ``min_accuracy`` alone moves every floor."""
        values = {key: value for key, value in overrides.items() if value is not None}
        unknown = set(values) - set(self.__dataclass_fields__)
        if unknown:
            known = sorted({*self.__dataclass_fields__, "gate_families", "min_accuracy"})
            raise ValueError(f"unknown gate thresholds {sorted(unknown)}; known: {known}")
        floors = dict(values.pop("floors", self.floors))
        if gate_families is not None:
            floors = {f: min_accuracy if min_accuracy is not None else floors.get(f, 0.8) for f in gate_families}
        elif min_accuracy is not None:
            floors = dict.fromkeys(floors, min_accuracy)
        return replace(self, floors=floors, **values)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Evidence:
    """What one version's manifest recorded, as far as the gate reads it."""

    version: str | None
    eval: dict | None
    performance_baseline: dict | None = None
    template_sha256: str | None = None  # the chat template the version ships (manifest.prompt_template)
    suite: dict | None = None  # the suite registered with the version (manifest.suite)
    comparison: dict | None = None  # its answers compared with another version's (manifest.comparison)

    @classmethod
    def of(cls, manifest) -> Evidence:
        template = (manifest.prompt_template or {}).get("sha256")
        return cls(
            manifest.version,
            manifest.eval,
            manifest.performance_baseline,
            template,
            manifest.suite,
            manifest.comparison,
        )

    @property
    def graded(self) -> bool:
        """Whether a labelled suite graded it (an eval with at least one family's rate)."""
        return bool((self.eval or {}).get("metrics", {}).get("accuracy"))


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


def evidence_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """A release needs evidence: a labelled suite's grades, or a comparison with the current
    version's answers. Without either only ``--force --reason`` promotes."""
    if candidate.graded or _compared_with_current(candidate, current):
        return []
    name = candidate.version or "the candidate"
    if current is None:
        return [
            f"{name} has no graded evaluation (a suite with assertions, `aieng eval`) and there is no "
            "current version to compare with: evaluate it with a labelled suite, or promote with --force --reason"
        ]
    stale = (candidate.comparison or {}).get("against")
    return [
        f"{name} has no graded evaluation and no comparison with {_label(current)}"
        + (f" (its comparison is with version {stale})" if stale else "")
        + f": run `aieng eval N@{name} --compare` (answers compared with the current version's), or "
        "evaluate it with a labelled suite (`aieng eval --suite FILE`)"
    ]


def suite_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """The grades must come from the suite registered with the version, not another one."""
    registered, measured = (candidate.suite or {}).get("sha256"), (candidate.eval or {}).get("suite_sha256")
    if not candidate.graded or registered is None or measured == registered:
        return []
    if measured is None and candidate.eval.get("suite") == candidate.suite.get("label"):
        return []  # recorded before suites were hashed: the name is all there is to compare
    return [
        f"evaluated with suite {candidate.eval.get('suite')} ({str(measured)[:12]}), but registered with "
        f"{candidate.suite.get('label')} ({registered[:12]}): re-run `aieng eval` on the registered suite"
    ]


def floor_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """Families below their floor; a family the eval did not measure counts as 0."""
    if not candidate.graded:
        return []
    accuracy = candidate.eval["metrics"]["accuracy"]
    failures = []
    for family, floor in thresholds.floors.items():
        rate = accuracy.get(family)
        if rate is None:
            failures.append(f"{family}: not measured (counts as 0%) < {_percent(floor)}")
        elif rate < floor - _EPSILON:
            failures.append(f"{family}: {rate:.1%} < {_percent(floor)}")
    return failures


def regression_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """Families that drop more than ``max_regression`` below the current version's eval."""
    if not candidate.graded or not _same_suite(candidate, current):
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
    if candidate.eval is None:
        return []
    value = candidate.eval["metrics"].get("perplexity")
    if value is None:
        if thresholds.max_perplexity is None:
            return []
        return ["not measured: re-run `aieng eval` in process on a suite that measures perplexity"]
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
    if candidate.eval is None:
        return []
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


def comparison_failures(candidate: Evidence, current: Evidence | None, thresholds: GateThresholds) -> list[str]:
    """The candidate's greedy answers against the current version's, when it was compared with it:
    agreement, length, empty and refused answers, and how likely the current answers stay."""
    if not _compared_with_current(candidate, current):
        return []
    record = candidate.comparison
    m = record["metrics"]
    failures = []
    if m["agreement"] < thresholds.min_agreement - _EPSILON:
        changed = ", ".join(c["id"] for c in record.get("changed", [])[:5])
        failures.append(
            f"agreement {m['agreement']:.1%} < {_percent(thresholds.min_agreement)} with {_label(current)} "
            f"({m['changed']} of {m['cases']} answers changed, e.g. {changed})"
        )
    if not thresholds.min_length_ratio - _EPSILON <= m["length_ratio"] <= thresholds.max_length_ratio + _EPSILON:
        failures.append(
            f"answers {m['length_ratio']:.2f}x as long as {_label(current)}'s, outside "
            f"[{thresholds.min_length_ratio:g}, {thresholds.max_length_ratio:g}]"
        )
    for kind, limit in (("empty", thresholds.max_empty_rise), ("refusal", thresholds.max_refusal_rise)):
        new, old = m[f"{kind}_rate"], m[f"stable_{kind}_rate"]
        if new > old + limit + _EPSILON:
            failures.append(
                f"{kind} answers {new:.1%} vs {old:.1%} ({_label(current)}), more than {_percent(limit)} up"
            )
    ratio = m.get("perplexity_ratio")
    if ratio is not None and ratio > thresholds.max_perplexity_ratio + _EPSILON:
        failures.append(
            f"{_label(current)}'s answers are {ratio:.2f}x as perplexing under the candidate "
            f"(> {thresholds.max_perplexity_ratio:g})"
        )
    return failures


RULES = {
    "evidence": evidence_failures,
    "suite": suite_failures,
    "comparison": comparison_failures,
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
    failures = [
        {"rule": name, "message": message}
        for name, rule in RULES.items()
        for message in rule(candidate, current, thresholds)
    ]
    compared = {
        "eval": _same_suite(candidate, current),
        "answers": _compared_with_current(candidate, current),
        "performance": _same_load(candidate, current),
    }
    return GateDecision(passed=not failures, failures=failures, compared=compared)


def _same_suite(candidate: Evidence, current: Evidence | None) -> bool:
    """Both graded on the same suite: same name, and the same content hash where both have one."""
    if current is None or candidate.eval is None or "accuracy" not in (current.eval or {}).get("metrics", {}):
        return False
    new, old = candidate.eval, current.eval
    if new.get("suite") != old.get("suite"):
        return False
    return (
        new.get("suite_sha256") is None or old.get("suite_sha256") is None or new["suite_sha256"] == old["suite_sha256"]
    )


def _compared_with_current(candidate: Evidence, current: Evidence | None) -> bool:
    record = candidate.comparison or {}
    return current is not None and bool(record.get("metrics")) and record.get("against") == current.version


def _same_load(candidate: Evidence, current: Evidence | None) -> bool:
    if current is None or not candidate.performance_baseline or not current.performance_baseline:
        return False
    keys = ("concurrency", "max_tokens")
    return all(candidate.performance_baseline.get(k) == current.performance_baseline.get(k) for k in keys)
