"""Hot swap on a real 2-worker server under streaming load: promote and roll back with no failed
request, every response naming its version; refused versions leave the old one serving; the
admin route's authentication."""

import asyncio
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from aieng.observability.scrape import scrape
from aieng.release.reload import worker_versions
from aieng.store import ModelRef

from ...machine_share import machine
from ...polling import poll
from ...suites import write_prompts_only_suite

TOKEN = "test-admin-token"  # the admin token of the server fixture (conftest.py)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server_args() -> list[str]:
    """Compiled, as ``aieng serve`` runs: a successor takes its predecessor's graphs under load."""
    return ["--workers", "2"]


def wait_for_version(base_url: str, version: str, timeout: float = 240.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        versions = worker_versions(base_url)
        if len(versions) == 2 and set(versions.values()) == {version}:
            return time.monotonic() - start
        time.sleep(0.25)
    raise AssertionError(f"workers did not all reach version {version}: {worker_versions(base_url)}")


async def stream_clients(base_url: str, clients: int, stop: asyncio.Event, records: list):
    """``clients`` streaming loops until ``stop``; one record per request: start, end, ok, version."""

    async def one(client: httpx.AsyncClient, i: int):
        while not stop.is_set():
            started, ok, version = time.monotonic(), False, None
            try:
                async with client.stream(
                    "POST",
                    "/v1/completions",
                    json={"model": "demo", "prompt": f"reverse: swap{i}", "max_tokens": 10, "stream": True},
                ) as r:
                    version = r.headers.get("x-model-version")
                    body = "".join([chunk async for chunk in r.aiter_text()])
                    ok = r.status_code == 200 and body.rstrip().endswith("data: [DONE]")
            except httpx.HTTPError:
                ok = False
            records.append((started, time.monotonic(), ok, version))

    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        await asyncio.gather(*(one(client, i) for i in range(clients)))


@pytest.fixture(scope="module")
def swaps_under_load(server, store):
    """Three promote/rollback cycles (12 worker swaps) under 16 streams, run once: what the two
    tests below judge, one the behaviour (no failed request, the versions, /metrics), the other
    the latency bound."""

    async def scenario():
        records, stop = [], asyncio.Event()
        load = asyncio.create_task(stream_clients(server.base_url, 16, stop, records))
        await asyncio.sleep(8)
        steady_end = time.monotonic()
        cycles = []  # (start, end) of each promote + rollback
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as admin:
            for cycle in range(3):
                cycle_start = time.monotonic()
                store.promote("demo", "2", reason=f"test: hot swap {cycle}")
                answer = await admin.post("/admin/reload", headers=AUTH)
                assert answer.status_code == 200 and answer.json()["version"] == "2", answer.text
                await asyncio.to_thread(wait_for_version, server.base_url, "2")
                store.rollback("demo", reason=f"test: roll back under load {cycle}")
                answer = await admin.post("/admin/reload", headers=AUTH)
                assert answer.status_code == 200 and answer.json()["version"] == "1", answer.text
                await asyncio.to_thread(wait_for_version, server.base_url, "1")
                cycles.append((cycle_start, time.monotonic()))
        swaps_end = time.monotonic()
        await asyncio.sleep(3)
        stop.set()
        await load
        return records, steady_end, swaps_end, cycles

    with machine.alone():  # the latency bound below is judged on what this measures
        records, steady_end, swaps_end, cycles = asyncio.run(scenario())
    return SimpleNamespace(records=records, steady_end=steady_end, swaps_end=swaps_end, cycles=cycles)


def test_promote_and_rollback_under_load_fail_no_request(swaps_under_load, server):
    records, steady_end, swaps_end = swaps_under_load.records, swaps_under_load.steady_end, swaps_under_load.swaps_end
    failed = [r for r in records if not r[2]]
    assert not failed, f"{len(failed)} of {len(records)} requests failed"
    assert all(version in ("1", "2") for *_, version in records)
    served_by = {version for start, end, ok, version in records if steady_end < start < swaps_end}
    assert served_by == {"1", "2"}  # the new version served traffic, then the old one again
    assert all(version == "1" for start, end, ok, version in records if start > swaps_end + 1)
    text = scrape(server.base_url)
    assert text.value("aieng_model_swaps_total", outcome="ok") >= 12  # two workers, six swaps each
    # Request metrics carry the version that served them: per version, /metrics counts exactly
    # the responses whose X-Model-Version named it.
    for version in ("1", "2"):
        served = sum(1 for *_, v in records if v == version)
        assert text.value("aieng_requests_total", route="/v1/completions", code="200", version=version) == served
        assert text.value("aieng_time_to_first_token_seconds_count", version=version) == served
        assert text.value("aieng_requests_finished_total", version=version) == served
    # One KV cache per worker through every swap: the new engine worked in the slots the old one's
    # requests did not need, then took the whole cache back.
    done = [json.loads(line) for line in server.output().splitlines() if '"swap_done"' in line]
    assert len(done) >= 12 and all(e["kv_cache"]["shared"] and e["kv_cache"]["reclaimed"] for e in done), done


@pytest.mark.perf(alone=False)  # judges what swaps_under_load measured with the machine alone
def test_a_swap_does_not_stall_the_streams_it_serves(swaps_under_load, server):
    """Each cycle's p99 is taken and the median cycle judged, so one hiccup of this shared machine
    cannot decide it but a stall on every swap (what compiling beside the serving engine once
    caused) does."""
    records, steady_end, swaps_end = swaps_under_load.records, swaps_under_load.steady_end, swaps_under_load.swaps_end
    steady = [end - start for start, end, ok, _ in records if end < steady_end and start > steady_end - 6]
    during = [end - start for start, end, ok, _ in records if steady_end < start < swaps_end]
    p99 = lambda xs: statistics.quantiles(xs, n=100)[98]  # noqa: E731
    cycles = swaps_under_load.cycles
    per_cycle = [p99([end - start for start, end, ok, _ in records if a < start < b]) for a, b in cycles]
    print(
        f"hot swap under load: {len(records)} requests, {len(during)} during the swaps "
        f"({swaps_end - steady_end:.1f} s), p99 {p99(during):.3f} s (per cycle "
        f"{', '.join(f'{x:.3f}' for x in per_cycle)}) vs steady {p99(steady):.3f} s"
    )
    # The median cycle: a stall on every swap (what compiling beside the serving engine once
    # caused: +0.33 s and +0.8 s on a 0.14 s p99) fails, one hiccup of this shared 2-core machine
    # during one cycle does not. Loading the new version takes CPU from the serving engines, so a
    # cycle's p99 may double on this machine (2.08x once in CI: 0.101 vs 0.049 s); the bound is
    # twice the steady p99 plus 0.1 s, which every known stall exceeds.
    swaps = [
        {k: e.get(k) for k in ("ts", "event", "seconds", "message")}
        for e in map(json.loads, (line for line in server.output().splitlines() if '"swap_' in line))
    ]
    assert statistics.median(per_cycle) <= 2 * p99(steady) + 0.1, (
        f"p99 per promote/rollback cycle {per_cycle} vs steady {p99(steady):.3f} s; swap log: {swaps}"
    )


def test_a_tampered_version_is_refused_and_the_old_one_keeps_serving(server, store, demo_model_dir):
    store.register(demo_model_dir, "demo", "3")
    weights = store.version_dir("demo", "3") / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # a flipped byte after registration
    weights.write_bytes(bytes(data))
    swaps_failed = lambda: scrape(server.base_url).value("aieng_model_swaps_total", outcome="failed")  # noqa: E731
    failed_before = swaps_failed()  # the module's server: earlier tests' refusals count too
    store._switch("demo", "3", action="promote", reason="test: bypass the verifying promote", actor="test")
    try:
        answer = httpx.post(f"{server.base_url}/admin/reload", headers=AUTH, timeout=120)
        assert answer.status_code == 409 and answer.json()["status"] == "failed"
        assert "failed verification" in answer.json()["error"]
        reply = httpx.post(
            f"{server.base_url}/v1/completions",
            json={"model": "demo", "prompt": "reverse: ab", "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200 and reply.headers["x-model-version"] == "1"
        # both workers refused it: the one the reload reached, and the other when it polled
        # `current`. Judged per worker (pid), not by the swap counter, which one worker alone
        # can move twice: its own poll may refuse the version just before the forced reload does
        pids = set(worker_versions(server.base_url))
        refused = {}

        def every_worker_refused():
            status = httpx.get(f"{server.base_url}/admin/status", headers=AUTH).json()
            refused[status["pid"]] = status
            return all(str(pid) in map(str, refused) for pid in pids) and all(
                s["swap"] is not None and s["swap"]["status"] == "failed" and s["swap"]["version"] == "3"
                for s in refused.values()
            )

        assert poll(every_worker_refused, timeout=60, poll_s=0.1), refused
        assert all(s["version"] == "1" for s in refused.values()), refused
        assert swaps_failed() >= failed_before + 2
        ready = httpx.get(f"{server.base_url}/health/ready").json()
        assert ready["version"] == "1" and ready["swap"]["status"] == "failed" and ready["swap"]["version"] == "3"
        assert set(worker_versions(server.base_url).values()) == {"1"}
    finally:
        store._switch("demo", "1", action="rollback", reason="test: restore", actor="test")


def test_a_version_that_fails_to_load_is_refused_and_the_old_one_keeps_serving(server, store, demo_model_dir, tmp_path):
    """Hashes fine, weights do not fit the config: loading fails, the running version stays."""
    import json
    import shutil

    broken = Path(shutil.copytree(demo_model_dir, tmp_path / "broken"))
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] *= 2  # the stored matrices no longer have the shapes the config announces
    (broken / "config.json").write_text(json.dumps(config))
    store.register(broken, "demo", "5")
    store.promote("demo", "5", reason="test: a version that cannot load")
    try:
        answer = httpx.post(f"{server.base_url}/admin/reload", headers=AUTH, timeout=120)
        assert answer.status_code == 409 and answer.json()["status"] == "failed", answer.text
        assert "verification" not in answer.json()["error"]  # the hashes were fine: loading itself failed
        reply = httpx.post(
            f"{server.base_url}/v1/completions",
            json={"model": "demo", "prompt": "reverse: ab", "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200 and reply.headers["x-model-version"] == "1"
        assert set(worker_versions(server.base_url).values()) == {"1"}
    finally:
        store.rollback("demo", "1", reason="test: restore")


def test_admin_routes_need_the_token(server):
    url = f"{server.base_url}/admin/reload"
    assert httpx.post(url).status_code == 401
    assert httpx.post(url, headers={"Authorization": "Basic abc"}).status_code == 401
    wrong = httpx.post(url, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "forbidden"
    status = f"{server.base_url}/admin/status"
    assert httpx.get(status).status_code == 401
    assert httpx.get(status, headers={"Authorization": "Bearer nope"}).status_code == 403
    worker = httpx.get(status, headers=AUTH).json()  # read-only: what the answering worker serves
    assert worker["model"] == "demo" and worker["version"] == "1" and worker["pid"] > 0 and worker["canary"] is None
    models = httpx.get(f"{server.base_url}/v1/models")
    card = models.json()["data"][0]
    assert models.headers["x-model-version"] == card["version"] == "1" and card["template_version"] == 1


def test_the_cli_promotes_and_rolls_back_a_running_server(server, store, monkeypatch, capsys):
    from aieng.cli.main import main

    base = ["--store", str(store.root), "model"]
    monkeypatch.delenv("AIENG_ADMIN_TOKEN", raising=False)
    assert main([*base, "rollback", "demo", "--to", "2", "--reload", server.base_url]) == 1
    assert "needs the server's admin token in AIENG_ADMIN_TOKEN" in capsys.readouterr().err
    # The store moved; the server was not told, but its workers poll `current` every 0.5 s and may
    # already be on 2: which version they serve at this instant is a race, not the CLI's doing.
    assert store.current("demo") == "2"
    monkeypatch.setenv("AIENG_ADMIN_TOKEN", TOKEN)
    wait_for_version(server.base_url, "2")  # the workers follow `current` by themselves too
    assert main([*base, "rollback", "demo", "--to", "1", "--reload", server.base_url]) == 0
    assert "2 worker(s) serve demo@1" in capsys.readouterr().out
    assert set(worker_versions(server.base_url).values()) == {"1"}


def test_the_watchdog_rolls_back_a_version_that_misses_its_baseline_unattended(server, store, monkeypatch):
    """v2's recorded baseline promises a p99 far below what it does here: live, its latency is
    more than twice the baseline, so the watchdog rolls back to v1 and swaps the server, alone."""
    import threading

    from aieng.cli.main import main

    monkeypatch.setenv("AIENG_ADMIN_TOKEN", TOKEN)
    store.update_manifest(
        ModelRef("demo", "2"),
        performance_baseline={
            "concurrency": 8,
            "max_tokens": 10,
            "tokens_per_s": 1e6,
            "latency_p99_s": 0.001,
            "ttft_p99_s": 0.001,
        },
    )
    store.promote("demo", "2", reason="test: forced past the gate")
    wait_for_version(server.base_url, "2")
    stop, records = asyncio.Event(), []
    load = threading.Thread(target=lambda: asyncio.run(_load_until(server.base_url, stop, records)), daemon=True)
    load.start()
    try:
        code = main(
            [
                "--store",
                str(store.root),
                "release",
                "watch",
                "demo",
                "--url",
                server.base_url,
                "--window",
                "20",
                "--interval",
                "1",
                "--min-requests",
                "10",
                "--no-probe",
            ]
        )
    finally:
        stop.set()
        load.join(60)
    assert code == 3 and store.current("demo") == "1"
    assert set(worker_versions(server.base_url).values()) == {"1"}
    rollback, watched = store.history("demo")[-2:]
    assert rollback["action"] == "rollback" and rollback["reason"].startswith("watchdog: latency: p99 latency")
    assert watched["action"] == "watch_rollback" and watched["decision"]["rule"] == "latency"
    assert records and all(ok for *_, ok, _ in records)  # the rollback under load failed nothing either


async def _load_until(base_url, stop, records):
    async def stopper():
        while not stop.is_set():
            await asyncio.sleep(0.1)

    event = asyncio.Event()
    task = asyncio.create_task(stream_clients(base_url, 8, event, records))
    await stopper()
    event.set()
    await task


def test_the_runbooks_hot_swap_the_running_server(server, store, monkeypatch, tmp_path):
    from aieng.workbook.runbooks import execute

    monkeypatch.setenv("AIENG_ADMIN_TOKEN", TOKEN)
    params = {"name": "demo", "store": str(store.root), "dry_run": False, "server_url": server.base_url}
    params["reason"] = "test: the runbook swaps the running server"
    execute("rollback", {**params, "to_version": "2"}, runs_dir=tmp_path)
    assert store.current("demo") == "2" and set(worker_versions(server.base_url).values()) == {"2"}
    record = execute("rollback", {**params, "to_version": "1"}, runs_dir=tmp_path).read_text()
    assert "serves demo@1 on every worker (no restart)" in record
    assert set(worker_versions(server.base_url).values()) == {"1"}


def test_the_watchdog_probe_rolls_back_a_fast_but_wrong_version(server, store, monkeypatch, tmp_path, demo_model_dir):
    """Noisy weights: as fast as v1, no errors, wrong answers. Only the live quality probe sees it."""
    from aieng.demo.degrade import perturbed_copy
    from aieng.release.watch import watch

    monkeypatch.setenv("AIENG_ADMIN_TOKEN", TOKEN)
    store.update_manifest(
        ModelRef("demo", "1"),
        eval={
            "suite": "demo-heldout-v1",
            "n_per_family": 50,
            "metrics": {"accuracy": {"reverse": 1.0, "json": 1.0, "add": 0.98, "sort": 1.0}, "perplexity": 1.01},
        },
    )
    store.register(perturbed_copy(demo_model_dir, tmp_path / "noisy"), "demo", "4")
    store.promote("demo", "4", reason="test: a broken version forced live")
    wait_for_version(server.base_url, "4")
    result = watch(store, "demo", server.base_url, interval_s=0.5, log=lambda _: None)
    assert result.rolled_back_to == "1" and result.decision.rule == "eval_regression"
    assert store.history("demo")[-2]["reason"].startswith("watchdog: eval_regression:")
    assert set(worker_versions(server.base_url).values()) == {"1"}
    from aieng.release.probe import quality_probe, regressed

    suite = store.suite(ModelRef("demo", "1"))  # the probe asks the suite registered with the version
    healthy = quality_probe(server.base_url, "demo", suite)  # and passes the version that is fine
    assert len(healthy.cases) == 32 and all(c.use == "probe" for c in healthy.cases)  # never the gate's cases
    assert not regressed(healthy.rates, store.manifest(ModelRef("demo", "1")).eval["metrics"]["accuracy"]), healthy


def test_the_watchdog_holds_a_suite_without_assertions_to_what_the_replaced_version_served(
    server, store, monkeypatch, capsys, tmp_path, demo_model_dir
):
    """No labels, and after a swap the replaced version is no longer served: its answers to the
    new version's probe are recorded while it is (`aieng release record-answers`, as the deploy
    runbook does before its swap). An exact copy agrees and is kept; the watch records the copy's
    answers in turn, and the next release, one decoder layer perturbed, is rolled back on them."""
    from aieng.cli.main import main
    from aieng.demo.degrade import perturbed_copy
    from aieng.release.watch import watch

    monkeypatch.setenv("AIENG_ADMIN_TOKEN", TOKEN)
    stable, url = store.current("demo"), server.base_url
    suite = write_prompts_only_suite(tmp_path / "prompts.yaml")
    store.register(demo_model_dir, "demo", "6", suite=suite)
    store.register(
        perturbed_copy(demo_model_dir, tmp_path / "layer", only="layers.1.", noise=2.0), "demo", "7", suite=suite
    )
    record = ["--store", str(store.root), "release", "record-answers", "demo", "--url", url, "--for", "6"]
    assert main(record) == 0 and f"served for demo@{stable} (5 kept)" in capsys.readouterr().out

    store.promote("demo", "6", reason="test: an exact copy")
    wait_for_version(url, "6")
    logs: list[str] = []
    copy = watch(store, "demo", url, interval_s=0.5, max_wait_s=1.0, log=logs.append)
    assert copy.rolled_back_to is None and store.current("demo") == "6", logs
    assert f"100% of 5 answers agree with demo@{stable}'s served answers" in " ".join(logs)
    assert store.manifest(ModelRef("demo", "6")).served_answers["by"] == "watch"

    store.promote("demo", "7", reason="test: a perturbed layer forced live")
    wait_for_version(url, "7")
    logs = []
    moved = watch(store, "demo", url, interval_s=0.5, log=logs.append)
    assert moved.rolled_back_to == "6" and moved.decision.rule == "eval_regression", logs
    assert "answers agree with 6 on" in store.history("demo")[-2]["reason"]
    assert set(worker_versions(url).values()) == {"6"}
    store.rollback("demo", to=stable, reason="test: back to the stable version")
    wait_for_version(url, stable)


def test_admin_routes_are_absent_without_a_token(inprocess_demo):
    """The served app without AIENG_ADMIN_TOKEN (in-process: the routes are the app's business)."""
    assert not inprocess_demo.runtime.settings.admin_token
    assert inprocess_demo.post("/admin/reload", headers=AUTH).status_code == 404
    assert inprocess_demo.get("/admin/status", headers=AUTH).status_code == 404


def test_a_swapped_in_version_never_reads_the_old_versions_prefix_cache(server, store):
    """The old version's workers keep a prompt's keys and values; after the swap the same prompt
    finds nothing (a new version's keys and values differ, and its engine starts with nothing kept)."""
    body = {"model": "demo", "prompt": "context: " + "apple stone river moon sun " * 20, "max_tokens": 2}

    def cached() -> tuple[str, int]:
        answer = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.headers["x-model-version"], answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    before = [cached() for _ in range(4)]
    assert {v for v, _ in before} == {"1"} and max(c for _, c in before) > 50, before
    store.promote("demo", "2", reason="test: prefix cache across a swap")
    assert httpx.post(f"{server.base_url}/admin/reload", headers=AUTH, timeout=300).status_code == 200
    wait_for_version(server.base_url, "2")
    version, after = cached()
    assert version == "2" and after < 16
    store.rollback("demo", "1", reason="test: back to 1")
    assert httpx.post(f"{server.base_url}/admin/reload", headers=AUTH, timeout=300).status_code == 200
    wait_for_version(server.base_url, "1")
