"""torch.compile's cache directory: aieng's setting, unless the user set torch's own variable."""

from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from aieng.server.process.compile_cache import compile_cache_delta, compile_cache_counts, use_compile_cache


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


def test_nothing_compiled_means_no_cache_counts():
    assert compile_cache_delta(compile_cache_counts()) == {}
