"""Promote through the release gate: the one path ``aieng model promote``, ``aieng demo install``
and the deploy runbook take, so a version becomes current only by passing the gate or by a
named person overriding it with a reason.

The gate runs under the store's lock against the version that is current at that moment
(``ModelStore.promote(check=...)``); its decision, the thresholds, who and why are written to the
promoted version's manifest (``release_gate``) and to the history event (``gate``). A refusal
changes nothing but history, where it is recorded as ``gate_refused`` so an audit sees every
attempt, not only the ones that went through.
"""

from __future__ import annotations

from dataclasses import dataclass

from aieng.errors import GateRefusedError, StoreError
from aieng.evaluation.gate import Evidence, GateDecision, GateThresholds, release_gate
from aieng.store import ModelRef, ModelStore
from aieng.store.stamps import default_actor, utc_now


@dataclass
class Promotion:
    event: dict  # the history event of the switch
    decision: GateDecision

    @property
    def forced(self) -> bool:
        return not self.decision.passed


def thresholds_for(store: ModelStore, name: str, version: str, overrides: dict | None = None) -> GateThresholds:
    """The gate's thresholds for ``name@version``: those of the suite registered with it (the
    defaults where it has none), with every non-None override (flags, runbook parameters)."""
    suite = store.manifest(ModelRef(name, version)).suite or {}
    return GateThresholds.from_suite(suite.get("thresholds")).replaced(**(overrides or {}))


def judge(
    store: ModelStore,
    name: str,
    version: str,
    current: str | None,
    thresholds: GateThresholds | None = None,
    *,
    overrides: dict | None = None,
) -> GateDecision:
    """The gate's decision on ``name@version`` against ``current`` (None: no comparison), under
    ``thresholds`` (default: :func:`thresholds_for` the candidate, with ``overrides``).

    A candidate with no evidence gets a failing decision (rule ``evidence``) rather than an
    exception, so ``--force`` can still override it and the refusal is recorded like any other.
    """
    thresholds = thresholds or thresholds_for(store, name, version, overrides)
    candidate = Evidence.of(store.manifest(ModelRef(name, version)))
    against = None
    if current is not None and current != version and current in store.versions(name):
        against = Evidence.of(store.manifest(ModelRef(name, current)))
    try:
        return release_gate(candidate, against, thresholds)
    except ValueError as exc:
        return GateDecision(passed=False, failures=[{"rule": "eval", "message": str(exc)}])


def promote(
    store: ModelStore,
    name: str,
    version: str,
    *,
    thresholds: GateThresholds | None = None,
    overrides: dict | None = None,
    force: bool = False,
    reason: str | None = None,
    actor: str | None = None,
) -> Promotion:
    """Verify, gate and promote ``name@version``; raise ``GateRefusedError`` naming every rule
    that fired unless ``force`` (which needs a ``reason``: an override nobody can explain later
    is not an override but an accident)."""
    if force and not (reason or "").strip():
        raise StoreError(
            '--force overrides the release gate and needs --reason "..." saying why; '
            "it is recorded with your name in the manifest and history.jsonl"
        )
    actor = actor or default_actor()
    thresholds = thresholds or thresholds_for(store, name, version, overrides)
    outcome: dict = {}

    def check(current: str | None) -> dict:
        decision = judge(store, name, version, current, thresholds)
        outcome["decision"] = decision
        record = {
            "decision": decision.to_dict(),
            "thresholds": thresholds.to_dict(),
            "against": current,
            "forced": force and not decision.passed,
            "reason": reason,
            "actor": actor,
            "at": utc_now(),
        }
        if not decision.passed and not force:
            raise GateRefusedError(refusal_message(name, version, decision), decision=decision)
        return record

    try:
        event = store.promote(name, version, reason=reason or "promote", actor=actor, check=check)
    except GateRefusedError as exc:
        store.record_event(
            name,
            {
                "action": "gate_refused",
                "from": store.current(name),
                "to": version,
                "reason": reason or "promote",
                "actor": actor,
                "gate": {"decision": exc.decision.to_dict(), "thresholds": thresholds.to_dict()},
            },
        )
        raise
    return Promotion(event, outcome["decision"])


def refusal_message(name: str, version: str, decision: GateDecision) -> str:
    return (
        f"the release gate refused {name}@{version} (rules: {', '.join(decision.rules_fired)}): "
        + "; ".join(decision.messages)
        + f". It stays a candidate and `current` is unchanged. Fix and re-evaluate it, or override with "
        f'`aieng model promote {name} {version} --force --reason "..."`'
    )
