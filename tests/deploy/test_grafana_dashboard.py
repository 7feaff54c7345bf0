"""The Grafana dashboard read by grafana-foundation-sdk, whose types are generated from Grafana's
own dashboard schema: every key of the file must survive a decode and re-encode (a misspelt or
misplaced field is one Grafana silently ignores), and every query decodes as a Prometheus query.
That its queries return data from a real Prometheus: tests/server/process/test_dashboard.py."""

import json
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard, RowPanel
from grafana_foundation_sdk.models.prometheus import Dataquery

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "aieng-dashboard.json"


@pytest.fixture(scope="module", autouse=True)
def plugins():
    register_default_plugins()  # the panel and query types, so panels decode as what they are


def lost_in_a_round_trip(document: dict) -> list[str]:
    """Paths of the keys and values Grafana's types do not carry back."""
    back = json.loads(JSONEncoder().encode(Dashboard.from_json(document)))

    def walk(a, b, path: str) -> list[str]:
        if isinstance(a, dict):
            return [
                lost
                for key, value in a.items()
                for lost in (
                    [f"{path}/{key}"]
                    if not isinstance(b, dict) or key not in b
                    else walk(value, b[key], f"{path}/{key}")
                )
            ]
        if isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b):
                return [path]
            return [lost for i, (x, y) in enumerate(zip(a, b, strict=True)) for lost in walk(x, y, f"{path}[{i}]")]
        return [] if a == b else [f"{path}: {a!r} became {b!r}"]

    return walk(document, back, "")


def test_every_field_of_the_dashboard_is_one_grafanas_schema_knows():
    assert lost_in_a_round_trip(json.loads(DASHBOARD.read_text())) == []


def test_the_check_sees_a_misspelt_field():
    document = json.loads(DASHBOARD.read_text())
    document["panels"][0]["gridpos"] = document["panels"][0].pop("gridPos")
    document["panels"][1]["targets"][0]["legend_format"] = "p50"
    assert lost_in_a_round_trip(document) == ["/panels[0]/gridpos", "/panels[1]/targets[0]/legend_format"]


def test_every_query_is_a_prometheus_query_and_every_panel_a_known_kind():
    dashboard = Dashboard.from_json(json.loads(DASHBOARD.read_text()))
    panels = [p for p in dashboard.panels if not isinstance(p, RowPanel)]
    assert panels and {p.type_val for p in panels} == {"timeseries"}
    assert all(isinstance(t, Dataquery) and t.expr for p in panels for t in p.targets)
    assert dashboard.schema_version >= 39
