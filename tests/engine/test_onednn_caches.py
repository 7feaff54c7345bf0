"""oneDNN's kernel caches are bounded, so a process that multiplies many row counts stays flat;
the user's own bound wins; the engine sets the bound before it multiplies."""

import os
import subprocess
import sys

import pytest
import torch

from aieng.engine import Engine, EngineConfig
from aieng.engine.native import packed_weights
from aieng.engine.native.onednn_caches import CAPACITY, VARIABLES, bound_onednn_caches

# A fresh process (oneDNN reads the bounds at its first multiply) packs four fp32 matrices of the
# smollm2-135m shape and multiplies every row count from 1 to 149 through them, one thread.
_GROWTH_SCRIPT = """
import sys, psutil, torch
torch.set_num_threads(1)
if sys.argv[1] == "bounded":
    from aieng.engine.native.onednn_caches import bound_onednn_caches
    bound_onednn_caches()
from aieng.engine.native import packed_weights
weights = [torch.randn(o, i) * 0.02 for o, i in [(960, 576), (576, 576), (3072, 576), (576, 1536)]]
for w in weights:
    packed_weights.pack(w)
inputs = {i: torch.randn(150, i) for i in (576, 1536)}
def step(rows):
    with torch.inference_mode():
        for w in weights:
            packed_weights.packed_linear(inputs[w.shape[1]][:rows], w, 1)
step(150)
before = psutil.Process().memory_info().rss
for rows in range(1, 150):
    step(rows)
print((psutil.Process().memory_info().rss - before) / 2**20)
"""


def _growth_mib(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", _GROWTH_SCRIPT, mode], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(not packed_weights.supports(torch.float32), reason="no oneDNN packed linear here")
def test_many_row_counts_grow_the_process_little_with_the_bound_and_much_without():
    bounded, unbounded = _growth_mib("bounded"), _growth_mib("defaults")
    assert bounded < 80, f"{bounded:.0f} MiB over 149 row counts with the caches at {CAPACITY}"
    assert unbounded > 3 * bounded, (bounded, unbounded)  # the defaults keep every row count's kernels


def test_the_bound_fills_only_what_the_user_left_unset():
    environ = {"LRU_CACHE_CAPACITY": "512"}
    assert bound_onednn_caches(environ=environ) == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(CAPACITY),
        "LRU_CACHE_CAPACITY": "512",
    }
    assert environ == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(CAPACITY), "LRU_CACHE_CAPACITY": "512"}


def test_an_engine_bounds_the_caches_when_it_is_built(demo, monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    model, tokenizer = demo
    Engine(model, tokenizer, config=EngineConfig(compile=False))
    assert all(os.environ[name] == str(CAPACITY) for name in VARIABLES)
