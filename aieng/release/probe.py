"""A live quality probe: the version's own eval suite asked of the running server over HTTP.

Latency and error counters cannot see a model that answers fast and wrong. The probe asks a
seeded sample of the suite registered with the version (``probe.per_family`` cases per family,
``probe.seed``; cases marked ``use: probe`` when the suite has them, which the gate never
graded) through the routes clients use, greedily. A labelled suite is judged by its assertions
(pass rate per family, held to the stable version's); a suite without assertions by agreement
with the stable version's answers to the same questions (the canary's shadow probe, where both
versions are served side by side).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from aieng.evaluation.answers import Answer, server_answers
from aieng.evaluation.compare import comparison_metrics
from aieng.evaluation.suite import grade
from aieng.evaluation.suite_file import Case, Suite


@dataclass
class ProbeResult:
    cases: list[Case]
    answers: list[Answer]
    rates: dict[str, float] | None  # per family, when the suite has assertions


def probe_cases(suite: Suite) -> list[Case]:
    """The probe's sample: per family, ``probe.per_family`` cases drawn with ``probe.seed`` from
    the ``use: probe`` cases, or from the gate's cases when the suite marks none; greedy."""
    pool = [c for c in suite.cases if c.use == "probe"] or suite.gate_cases()
    per_family, rng = int(suite.probe["per_family"]), random.Random(suite.probe["seed"])
    chosen = []
    for family in suite.families:
        cases = [c for c in pool if c.family == family]
        picked = cases if len(cases) <= per_family else sorted(rng.sample(cases, per_family), key=cases.index)
        chosen.extend(replace(c, sampling={**c.sampling, "temperature": 0.0}) for c in picked)
    return chosen


def quality_probe(url: str, model: str, suite: Suite, *, token: str | None = None) -> ProbeResult:
    """Ask the server the suite's probe sample for ``model`` (``name`` or ``name@version``)."""
    cases = probe_cases(suite)
    answers = server_answers(url, model, cases, token=token)
    rates = grade(suite, cases, answers)[0] if any(c.labelled for c in cases) else None
    return ProbeResult(cases, answers, rates)


def regressed(
    probe: dict[str, float], reference: dict[str, float] | None, margin: float = 0.25, against: str = "recorded"
) -> list[str]:
    """Families whose probe rate is more than ``margin`` below the reference (a wide margin: a probe
    of a few prompts per family is coarse). ``against`` names the reference in the message: the
    stable version's recorded eval for the watchdog, its live probe score for a canary."""
    if not reference:
        return []
    return [
        f"{family}: {probe.get(family, 0.0):.0%} live vs {rate:.0%} {against}"
        for family, rate in reference.items()
        if probe.get(family, 0.0) < rate - margin - 1e-9
    ]


def shadow_probe(
    url: str,
    name: str,
    version: str,
    stable: str,
    suite: Suite,
    *,
    margin: float = 0.25,
    min_agreement: float = 0.8,
    token: str | None = None,
) -> tuple[str, list[str], ProbeResult, ProbeResult]:
    """Ask the canary and the stable version the same probe sample, each pinned by version.

    Returns (what was seen, failures, canary's probe, stable's probe): failures are, with
    assertions, families whose canary rate falls more than ``margin`` below stable's; without, an
    agreement of the two versions' greedy answers below ``min_agreement``."""
    live = quality_probe(url, f"{name}@{version}", suite, token=token)
    reference = quality_probe(url, f"{name}@{stable}", suite, token=token)
    if live.rates is not None:
        seen = f"{len(live.cases)} cases of suite {suite.label}: canary {live.rates}, stable {reference.rates}"
        return seen, regressed(live.rates, reference.rates, margin, against="stable"), live, reference
    metrics, changed = comparison_metrics(live.cases, reference.answers, live.answers)  # the comparison gate's
    agreement = metrics["agreement"]
    seen = (
        f"{len(live.cases)} cases of suite {suite.label} (no assertions): {agreement:.0%} of answers agree with stable"
    )
    if agreement < min_agreement - 1e-9:
        ids = ", ".join(c["id"] for c in changed[:5])
        failures = [f"answers agree with stable on {agreement:.0%} < {min_agreement:.0%} (changed: {ids})"]
        return seen, failures, live, reference
    return seen, [], live, reference
