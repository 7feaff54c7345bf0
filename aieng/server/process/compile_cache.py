"""torch.compile's on-disk caches, kept across restarts.

torch.compile (torch 2.13) caches on disk under one directory, ``TORCHINDUCTOR_CACHE_DIR``: the
generated kernels, the FX graph cache (``torch._inductor.config.fx_graph_cache``, compiled graphs
keyed by graph and inputs) and the AOTAutograd cache (``torch._functorch.config.
enable_autograd_cache``, the traced joint graphs); on CUDA the Triton cache goes under it too.
Both caches are on by default, but the directory defaults to ``/tmp/torchinductor_<user>``, which
a reboot or a fresh container empties, and then a restart compiles everything again. ``aieng
serve`` points it at ``AIENG_COMPILE_CACHE_DIR`` (``~/.cache/aieng/compile-cache``: this user's,
whatever the checkout or working directory, so a fresh clone finds the graphs an earlier one
compiled; the cache keys hold the graph, the torch version and the compiler, not paths) in the
master, before anything compiles; the workers and inductor's compile subprocesses
inherit the environment. Dynamo's tracing is not cached: a warm cache shortens a compile, it does
not remove it. The warm-up's last log line counts its cache hits and misses.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"

# The keys of torch._dynamo.utils.counters that say whether a compile came from the cache.
_COUNTERS = {
    "fx_graph_hit": ("inductor", "fxgraph_cache_hit"),
    "fx_graph_miss": ("inductor", "fxgraph_cache_miss"),
    "aot_autograd_hit": ("aot_autograd", "autograd_cache_hit"),
    "aot_autograd_miss": ("aot_autograd", "autograd_cache_miss"),
}


def use_compile_cache(directory: Path | str, environ=os.environ) -> dict:
    """Point torch.compile's caches at ``directory`` (created), unless the user set
    ``TORCHINDUCTOR_CACHE_DIR`` themselves: torch's own variable wins.

    Returns what the start-up log line says: the directory, which variable chose it, and whether
    the FX graph and AOTAutograd caches are on (``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` or
    ``TORCHINDUCTOR_AUTOGRAD_CACHE=0`` turn one off; that stays the user's choice).
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    user_dir = environ.get(ENV)
    # torch writes its default into the environment the first time it asks: that is not the user's.
    if user_dir and os.path.abspath(user_dir) != os.path.abspath(default_cache_dir()):
        path, source = Path(user_dir), ENV
    else:
        path, source = Path(directory), "AIENG_COMPILE_CACHE_DIR"
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=True)
    environ[ENV] = str(path)
    return {
        "dir": str(path),
        "source": source,
        "fx_graph_cache": bool(inductor_config.fx_graph_cache),
        "aot_autograd_cache": bool(functorch_config.enable_autograd_cache),
    }


def compile_cache_counts() -> dict[str, int]:
    """The process's compile-cache hits and misses so far (zeros when nothing compiled)."""
    from torch._dynamo.utils import counters

    return {name: int(counters[group][key]) for name, (group, key) in _COUNTERS.items()}


def compile_cache_delta(before: dict[str, int]) -> dict[str, int]:
    """Hits and misses since ``before``; empty when nothing compiled (eager, or all in memory)."""
    now = compile_cache_counts()
    delta = {name: now[name] - before.get(name, 0) for name in now}
    return delta if any(delta.values()) else {}
