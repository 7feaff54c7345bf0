"""torch.compile's cache directory: aieng's setting, unless the user set torch's own variable."""

from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from aieng.server.process.compile_cache import compile_cache_counts, compile_cache_delta, use_compile_cache


def test_the_setting_points_torch_at_a_directory_that_survives_restarts(tmp_path):
    environ = {}
    info = use_compile_cache(tmp_path / "compile-cache", environ)
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == info["dir"] == str((tmp_path / "compile-cache").resolve())
    assert (tmp_path / "compile-cache").is_dir() and info["source"] == "AIENG_COMPILE_CACHE_DIR"
    assert info["fx_graph_cache"] and info["aot_autograd_cache"]  # torch 2.13's defaults


def test_torchs_own_variable_wins_but_not_the_default_torch_wrote_itself(tmp_path):
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}
    assert use_compile_cache(tmp_path / "aieng", environ)["source"] == "TORCHINDUCTOR_CACHE_DIR"
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    environ = {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}  # set by torch the first time it asked
    assert use_compile_cache(tmp_path / "aieng", environ)["dir"] == str((tmp_path / "aieng").resolve())


def test_the_delta_counts_the_cache_hits_and_misses_since_before_and_nothing_when_nothing_compiled():
    import torch
    from torch._dynamo.utils import counters

    before = compile_cache_counts()
    torch.ones(4) @ torch.ones(4)  # eager work compiles nothing
    assert compile_cache_delta(before) == {}
    counters["inductor"]["fxgraph_cache_hit"] += 2  # what a compile served from the FX graph cache counts
    counters["aot_autograd"]["autograd_cache_miss"] += 1
    try:
        assert compile_cache_delta(before) == {
            "fx_graph_hit": 2,
            "fx_graph_miss": 0,
            "aot_autograd_hit": 0,
            "aot_autograd_miss": 1,
        }
        assert compile_cache_delta(compile_cache_counts()) == {}  # since now: nothing
    finally:
        counters["inductor"]["fxgraph_cache_hit"] -= 2
        counters["aot_autograd"]["autograd_cache_miss"] -= 1
    assert compile_cache_delta(before) == {}
