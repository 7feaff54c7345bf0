"""The alert thresholds, read from the Prometheus rule file that pages people.

``deploy/prometheus/alerts.yml`` is the one place a threshold is decided; the triage runbook
reads its numbers from there, so its diagnosis can never disagree with the alert that sent
someone to run it.

Only rules of the form ``<expression> <op> <number>`` have a threshold here: a compound rule
(``and``/``or``/``unless``, or a comparison against another series) has no single number to
report, and is left out rather than guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from aieng.errors import ConfigError

# Like ``aieng.workbook.PROJECT_ROOT`` (not imported: observability must not depend on the
# notebook conveniences).
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_RULES = PROJECT_ROOT / "deploy" / "prometheus" / "alerts.yml"

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_TRAILING_COMPARISON = re.compile(rf"(?:>=|<=|==|!=|>|<)\s*(?:bool\s+)?({_NUMBER})\s*$")
_COMPOUND = re.compile(r"\b(?:and|or|unless)\b")


def alert_thresholds(path: str | Path | None = None) -> dict[str, float]:
    """``{alert name: threshold}`` for every rule in ``path`` that compares one expression to a constant.

    ``path`` defaults to the project's ``deploy/prometheus/alerts.yml``.
    """
    import yaml

    path = Path(path) if path else DEFAULT_RULES
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read alert rules from {path}: {exc}") from exc
    thresholds = {}
    for group in (document or {}).get("groups", []):
        for rule in group.get("rules", []):
            if "alert" not in rule:
                continue  # a recording rule
            expr = " ".join(str(rule.get("expr", "")).split())
            match = _TRAILING_COMPARISON.search(expr)
            if match and not _COMPOUND.search(expr):
                thresholds[rule["alert"]] = float(match.group(1))
    return thresholds


@dataclass(frozen=True)
class TriageThresholds:
    """The thresholds the triage runbook checks, each named after the alert it comes from."""

    ttft_p99_s: float  # AiengTTFTp99High: p99 time to first token, seconds
    server_error_rate: float  # AiengServerErrors: share of HTTP requests answered 5xx
    early_eos_rate: float  # AiengAbnormalEarlyEOS: share of finished requests that hit EOS early
    host_memory_used: float  # AiengHostMemoryHigh: share of host memory in use
    queue_saturation: float  # AiengQueueSaturated: waiting requests over queue capacity
    client_abort_rate: float  # AiengClientAbortRate: share of requests whose client left before the end
    kv_full_share: float  # AiengKVCachePressure: share of steps ending with every KV row taken, requests waiting


TRIAGE_ALERTS = {
    "ttft_p99_s": "AiengTTFTp99High",
    "server_error_rate": "AiengServerErrors",
    "early_eos_rate": "AiengAbnormalEarlyEOS",
    "host_memory_used": "AiengHostMemoryHigh",
    "queue_saturation": "AiengQueueSaturated",
    "client_abort_rate": "AiengClientAbortRate",
    "kv_full_share": "AiengKVCachePressure",
}


def triage_thresholds(path: str | Path | None = None) -> TriageThresholds:
    """The triage runbook's thresholds from the rule file; an alert it needs that is missing is an error."""
    found = alert_thresholds(path)
    missing = [alert for alert in TRIAGE_ALERTS.values() if alert not in found]
    if missing:
        raise ConfigError(
            f"{Path(path) if path else DEFAULT_RULES} has no single-threshold rule for "
            f"{', '.join(missing)}; the triage runbook needs them"
        )
    return TriageThresholds(**{f.name: found[TRIAGE_ALERTS[f.name]] for f in fields(TriageThresholds)})
