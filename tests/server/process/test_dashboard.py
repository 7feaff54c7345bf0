"""The Grafana dashboard's every query, run by a real Prometheus that scrapes a real 2-worker server
under a short load: each must return data. The conditions some panels need are provoked here (a
canary in progress for the per-version panels, a client that leaves mid-stream for the abort
panel, a bad request for the error panel); only the GPU targets may come back empty, on a CPU
host, and their panels must say so."""

import json
import math
import time
from pathlib import Path

import httpx
import pytest

from aieng.release.reload import worker_canaries

from ...polling import poll

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "aieng-dashboard.json"
NEEDS_A_GPU = ("aieng_cuda_", "aieng_gpu_")


def targets() -> list[tuple[dict, dict]]:
    """(panel, target) for every query of the dashboard, rows' panels included."""
    found, stack = [], list(json.loads(DASHBOARD.read_text())["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        found.extend((panel, target) for target in panel.get("targets", []))
    return found


def test_every_panel_has_a_unique_id_a_prometheus_datasource_and_fits_the_grid():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    assert len(targets()) >= 40


def query(prometheus_url: str, expr: str) -> list[float]:
    """The instant values of ``expr`` (Grafana's ``$__rate_interval`` as 30 s), NaNs left out."""
    answer = httpx.get(
        f"{prometheus_url}/api/v1/query", params={"query": expr.replace("$__rate_interval", "30s")}, timeout=10
    ).json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    return [float(v["value"][1]) for v in answer["data"]["result"] if not math.isnan(float(v["value"][1]))]


@pytest.fixture
def canary_in_progress(server, store):
    """demo@2 at 30% beside demo@1, on both workers: what the per-version panels compare."""
    from aieng.store.canary_record import clear_canary, set_canary

    set_canary(store, "demo", "2", 0.3, reason="test: the dashboard's per-version panels")
    assert poll(lambda: len(worker_canaries(server.base_url)) == 2, timeout=120)
    yield
    clear_canary(store, "demo", reason="test: done")
    assert poll(lambda: not worker_canaries(server.base_url), timeout=120)


def test_every_query_returns_data_from_a_real_prometheus(server, canary_in_progress, prometheus):
    url = prometheus(server.base_url)
    body = {"model": "demo", "prompt": "<|bos|><|user|>reverse: abcdef<|end|><|assistant|>", "max_tokens": 8}

    def needs_a_gpu(target: dict) -> bool:
        return any(metric in target["expr"] for metric in NEEDS_A_GPU)

    def without_data() -> dict:
        return {
            f"{panel['title']} / {target['legendFormat']}": (panel, target)
            for panel, target in targets()
            if not query(url, target["expr"])
        }

    # Load until every query but the GPU ones has data (a rate() needs two 1 s scrapes that saw the
    # counters move): the condition, not a fixed time.
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        while True:
            for _ in range(4):
                assert client.post("/v1/completions", json=body).status_code == 200
            assert client.post("/v1/completions", json={**body, "temperature": -1}).status_code == 400
            stream = {**body, "max_tokens": 300, "ignore_eos": True, "stream": True}
            with client.stream("POST", "/v1/completions", json=stream) as reply:
                next(line for line in reply.iter_lines() if line.startswith("data: {"))  # leave mid-stream
            empty = without_data()
            missing = sorted(name for name, (_, target) in empty.items() if not needs_a_gpu(target))
            if not missing:
                break
            assert time.monotonic() < deadline, f"queries without data after 60 s of load: {missing}"
    gpu_only = {name: panel for name, (panel, _) in empty.items()}  # all that is left empty
    assert gpu_only, "on this CPU host the GPU targets are empty: a check that sees no empty query sees nothing"
    for name, panel in gpu_only.items():
        assert "GPU" in panel.get("description", "") + panel["title"], f"{name}: say that it needs a GPU host"
