"""``aieng bench serve --peer ...``: choosing peers, their request bodies, the message when one is
not installed, and the process handling of a peer server."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from aieng.bench import peers
from aieng.bench.peers import PeerServer, PeerSpec, PeerUnavailable, check_available, parse_peers, peer_body_extra
from aieng.bench.serve_bench import ServeBenchConfig, ServeBenchResult, run_serve_bench
from aieng.bench.serve_report import evaluate_targets, format_table

REPO = Path(__file__).resolve().parents[2]


def test_peers_parse_from_repeats_comma_lists_and_formats():
    assert parse_peers(None) == [] and parse_peers([]) == []
    assert parse_peers(["transformers"]) == [PeerSpec("transformers")]
    assert parse_peers(["transformers", "llama.cpp"]) == [PeerSpec("transformers"), PeerSpec("llama.cpp", "f32")]
    assert parse_peers(["transformers,llama.cpp"], "f32,q8_0") == [
        PeerSpec("transformers"),
        PeerSpec("llama.cpp", "f32"),
        PeerSpec("llama.cpp", "q8_0"),
    ]
    assert parse_peers(["llama.cpp:q8_0", "llama.cpp:q8_0", "llama-cpp-python"]) == [
        PeerSpec("llama.cpp", "q8_0"),
        PeerSpec("llama-cpp-python", "f32"),
    ]
    assert [s.label for s in parse_peers(["transformers", "llama.cpp:q8_0"])] == ["transformers_cb", "llama.cpp_q8_0"]
    assert parse_peers(["llama.cpp"], "bf16,q4_0") == [PeerSpec("llama.cpp", "bf16"), PeerSpec("llama.cpp", "q4_0")]
    for bad, fmt in (
        (["vllm"], "f32"),
        (["llama.cpp:q5_k"], "f32"),
        (["llama.cpp"], "f16"),
        (["transformers:f32"], "f32"),
    ):
        with pytest.raises(ValueError):
            parse_peers(bad, fmt)


def test_the_cli_takes_peers_and_refuses_unknown_ones(capsys):
    from aieng.cli.main import build_parser, main

    args = build_parser().parse_args(
        [
            "bench",
            "serve",
            "--peer",
            "transformers",
            "--peer",
            "llama.cpp,llama-cpp-python",
            "--peer-format",
            "q8_0",
            "--concurrency",
            "1,32",
            "--max-tokens",
            "64",
            "--no-aieng",
            "--peer-threads",
            "2",
        ]
    )
    assert parse_peers(args.peer, args.peer_format) == [
        PeerSpec("transformers"),
        PeerSpec("llama.cpp", "q8_0"),
        PeerSpec("llama-cpp-python", "q8_0"),
    ]
    assert args.no_aieng and args.peer_threads == 2 and args.max_tokens == 64
    assert main(["bench", "serve", "--peer", "vllm"]) == 1
    assert "--peer 'vllm': choose from transformers, llama.cpp, llama-cpp-python" in capsys.readouterr().err


def test_each_weight_format_is_an_aieng_server_of_its_own_and_an_unknown_one_is_refused(monkeypatch, capsys):
    """``--weight-formats auto,int8``: the first format is ``aieng`` (and its batching-off run), each
    other one ``aieng_FMT``, every server started with its AIENG_WEIGHT_FORMATS."""
    from aieng.bench import serve_bench
    from aieng.cli.main import main

    started = []

    class Recorded:
        def __init__(self, *, store, model, extra_args, env=None):
            started.append((extra_args, env))
            self.base_url = "http://127.0.0.1:1"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait_until_compiled(self, log):
            pass

    monkeypatch.setattr(serve_bench, "ServerProcess", Recorded)
    monkeypatch.setattr(serve_bench, "measure_levels", lambda url, bodies, config, progress: {1: {}})
    monkeypatch.setattr("aieng.bench.serve_report.evaluate_targets", lambda bench: {})
    config = serve_bench.ServeBenchConfig(concurrencies=(1,), measure_pss=False, weight_formats=("auto", "int8"))
    bench = serve_bench.run_serve_bench("store", "m@1", "dir", None, config, log=lambda m: None)
    assert list(bench.results) == ["aieng", "aieng_batching_off", "aieng_int8"]
    assert [env["AIENG_WEIGHT_FORMATS"] for _, env in started] == ["auto", "auto", "int8"]
    assert "--max-batch-size" in started[1][0] and "--max-batch-size" not in started[2][0]

    # PSS is measured on the first format, 1 worker then 2, and the report says which
    started.clear()
    monkeypatch.setattr(serve_bench, "warm_up", lambda url, bodies: None)
    monkeypatch.setattr(serve_bench, "worker_pss", lambda proc, n: [100 * 2**20] * n)
    monkeypatch.setattr(serve_bench, "pss_bytes", lambda pid: 50 * 2**20)
    Recorded.process = type("Process", (), {"pid": 1})
    config = serve_bench.ServeBenchConfig(
        concurrencies=(1,), weight_formats=("int4", "auto"), include_batching_off=False
    )
    bench = serve_bench.run_serve_bench("store", "m@1", "dir", None, config, log=lambda m: None)
    pss_runs = started[2:]
    assert [(args, env["AIENG_WEIGHT_FORMATS"]) for args, env in pss_runs] == [
        (["--workers", "1"], "int4"),
        (["--workers", "2"], "int4"),
    ]
    assert bench.pss["weight_format"] == "int4" and bench.pss["ratio"] == 250 / 150

    assert main(["bench", "serve", "--weight-formats", "auto,int2"]) == 1
    assert "--weight-formats 'auto,int2': choose from auto, float32" in capsys.readouterr().err


def test_each_peer_gets_its_own_way_to_ignore_eos():
    assert peer_body_extra("aieng", 8, 2) == {"ignore_eos": True}
    assert peer_body_extra("llama.cpp", 8, 2) == {"ignore_eos": True}
    assert peer_body_extra("llama-cpp-python", 8, 2) == {"logit_bias": {"2": -1e9}}
    assert '"min_new_tokens": 8' in peer_body_extra("transformers", 8, 2)["generation_config"]
    assert peer_body_extra(True, 8, 2) == peer_body_extra("transformers", 8, 2)  # the older peer=True


def test_a_missing_peer_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(peers, "find_llama_server", lambda: None)
    with pytest.raises(PeerUnavailable, match=r"python -m aieng.bench.peers build-llama-server"):
        check_available(PeerSpec("llama.cpp", "f32"))
    monkeypatch.setattr(peers, "llama_cpp_python_missing", lambda: ["llama_cpp"])
    with pytest.raises(PeerUnavailable, match=r"pip install 'llama-cpp-python\[server\]==0\.3\.36'"):
        check_available(PeerSpec("llama-cpp-python", "f32"))


def test_the_bench_goes_on_without_a_missing_peer(monkeypatch, tmp_path):
    monkeypatch.setattr(peers, "find_llama_server", lambda: None)
    monkeypatch.setattr(peers, "llama_cpp_python_missing", lambda: ["llama_cpp"])
    config = ServeBenchConfig(
        peers=(PeerSpec("llama.cpp", "f32"), PeerSpec("llama-cpp-python", "q8_0")),
        include_aieng=False,
        measure_pss=False,
        gguf_cache=tmp_path,
    )
    logged = []
    bench = run_serve_bench(tmp_path, "demo@1", tmp_path, None, config, log=logged.append)
    assert bench.results == {} and set(bench.peer_errors) == {"llama.cpp_f32", "llama-cpp-python_q8_0"}
    assert "pip install 'llama-cpp-python[server]==0.3.36'" in bench.peer_errors["llama-cpp-python_q8_0"]
    assert any("skipped" in line for line in logged)
    assert "peer llama.cpp_f32 not measured: llama.cpp: no llama-server binary" in format_table(bench)


def test_peer_ratios_are_reported_beside_aieng():
    def level(tok_s, p99):
        return {
            "ok": 8,
            "req_per_s": tok_s / 64,
            "output_tok_per_s": tok_s,
            "latency_p50_s": p99 / 2,
            "latency_p99_s": p99,
            "ttft_p50_s": 0.1,
            "ttft_p99_s": 0.2,
            "mean_completion_tokens": 64.0,
            "errors": 0,
        }

    bench = ServeBenchResult(
        results={
            "aieng": {1: level(40, 2.0), 32: level(300, 8.0)},
            "llama.cpp_q8_0": {1: level(80, 1.0), 32: level(120, 20.0)},
        }
    )
    targets = bench.targets = evaluate_targets(bench)
    assert targets["vs_llama.cpp_q8_0_c32"]["value"] == 2.5 and targets["vs_llama.cpp_q8_0_c32"]["p99_ratio"] == 0.4
    assert targets["vs_llama.cpp_q8_0_c1"]["value"] == 0.5 and targets["vs_llama.cpp_q8_0_c1"]["met"] is None
    assert (
        "target vs_llama.cpp_q8_0_c32: 2.5 (aieng/peer tok/s (reported), p99 aieng/peer 0.4) -> reported"
        in format_table(bench)
    )


def test_aiengs_c32_share_of_the_plain_forward_is_a_target():
    level = {
        "ok": 64,
        "req_per_s": 3.0,
        "output_tok_per_s": 180.0,
        "latency_p50_s": 10.0,
        "latency_p99_s": 12.0,
        "ttft_p50_s": 1.0,
        "ttft_p99_s": 4.0,
        "mean_completion_tokens": 64.0,
        "errors": 0,
    }
    plain = {"batch": 32, "threads": 2, "tok_s": 200.0}
    bench = ServeBenchResult(results={"aieng": {32: level}}, plain_forward=plain)
    bench.targets = evaluate_targets(bench)
    assert (
        bench.targets["share_of_plain_forward_c32"]["value"] == 0.9
        and bench.targets["share_of_plain_forward_c32"]["met"]
    )
    table = format_table(bench)
    assert "plain batched forward, batch 32, 2 threads: 200.0 tok/s" in table
    assert "target share_of_plain_forward_c32: 0.9" in table and "-> met" in table
    slow = ServeBenchResult(results={"aieng": {32: {**level, "output_tok_per_s": 150.0}}}, plain_forward=plain)
    assert evaluate_targets(slow)["share_of_plain_forward_c32"] == {
        "value": 0.75,
        "target": ">= 0.8 (aieng C=32 tok/s over the plain batched forward at batch 32)",
        "met": False,
    }
    assert "share_of_plain_forward_c32" not in evaluate_targets(ServeBenchResult(results={"aieng": {32: level}}))


def test_the_plain_forward_is_measured_on_the_models_own_weights(tiny_shape_model_dir, tmp_path):
    config = ServeBenchConfig(include_aieng=False, measure_pss=False, plain_forward=True)
    logged = []
    bench = run_serve_bench(tmp_path, "tiny@1", tiny_shape_model_dir, None, config, log=logged.append)
    assert bench.plain_forward["batch"] == 32 and bench.plain_forward["threads"] >= 1
    assert bench.plain_forward["tok_s"] > 0
    assert any("plain batched forward" in line for line in logged)


def test_a_peer_server_gets_a_free_port_and_stops(tmp_path):
    (tmp_path / "health").write_text("ok")  # http.server answers GET /health with this file: "ready"
    server = PeerServer(
        name="fake peer",
        argv=[sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        ready_timeout=30,
    )
    with server:
        assert server.port and server.process.poll() is None
        assert str(server.port) in server.command()
    assert server.process.poll() is not None
    failing = PeerServer(name="broken peer", argv=[sys.executable, "-c", "raise SystemExit(3)"], ready_timeout=30)
    with pytest.raises(RuntimeError, match="broken peer exited with status 3"):
        failing.start()


def test_peer_pins_match_the_packaging():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["peers"] == [peers.LLAMA_CPP_PYTHON]
    gguf_pin = [d for d in project["dependencies"] if d.startswith("gguf")]
    from aieng.locks.lockfile import read_lock

    lock = read_lock(REPO / "locks" / "server.lock")
    assert gguf_pin and f"gguf=={lock['gguf']}" == gguf_pin[0]
    assert "llama-cpp-python" not in lock and "llama-cpp-python" not in read_lock(REPO / "locks" / "dev.lock")


def test_connection_per_request_swaps_the_load_clients_connector_only_inside():
    import aiohttp

    original = aiohttp.TCPConnector
    with peers.connection_per_request():
        assert aiohttp.TCPConnector.keywords == {"force_close": True}
    assert aiohttp.TCPConnector is original
    with peers.connection_per_request(False):
        assert aiohttp.TCPConnector is original


def test_every_aieng_format_is_set_beside_every_gguf_peer():
    from aieng.bench.serve_bench import ServeBenchResult
    from aieng.bench.serve_report import evaluate_targets

    def level(tok_s, p99):
        return {1: {"ok": 16, "output_tok_per_s": tok_s, "latency_p99_s": p99}}

    bench = ServeBenchResult(
        results={
            "aieng": level(25.0, 2.6),
            "aieng_int8": level(39.0, 1.7),
            "aieng_batching_off": level(25.0, 2.6),
            "llama.cpp_q8_0": level(26.0, 2.4),
        }
    )
    targets = evaluate_targets(bench)
    assert targets["vs_llama.cpp_q8_0_c1"]["value"] == 0.96
    assert targets["aieng_int8_vs_llama.cpp_q8_0_c1"]["value"] == 1.5
    assert targets["aieng_int8_vs_llama.cpp_q8_0_c1"]["p99_ratio"] == 0.71
    assert not any(key.startswith("aieng_batching_off") for key in targets)
