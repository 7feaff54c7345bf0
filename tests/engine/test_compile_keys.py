"""Inductor's C++ kernel keys without the environment's folders (aieng/engine/compile_keys.py):
the same torch in another venv finds the cached kernels, another torch does not."""

from __future__ import annotations

import os
import sys

import torch
from torch._inductor import codecache

from aieng.engine.compile_keys import environment_free, key_kernels_by_torch_version


def torch_in(venv: str) -> str:
    return f"{venv}/lib/python3.11/site-packages/torch"


def command(venv: str) -> str:
    torch_dir = torch_in(venv)
    return f"g++ i -I{torch_dir}/include -I{torch_dir}/include/api -L{torch_dir}/lib -L{venv}/lib -o o -O3"


def test_two_environments_with_the_same_torch_give_one_key_and_another_torch_its_own():
    one, two = "/home/a/clone-1/.venv", "/tmp/ci-9f3/project/.venv"
    same = [environment_free(command(v), torch_in(v), v, "2.13.0 abc") for v in (one, two)]
    assert same[0] == same[1] and "<torch 2.13.0 abc>/include" in same[0] and "<environment>/lib" in same[0]
    other = environment_free(command(one), torch_in(one), one, "2.14.0 def")
    assert other != same[0]
    assert environment_free("g++ -O3 i -o o", "/x/torch", "/x", "2.13.0") == "g++ -O3 i -o o"  # nothing to replace


def test_the_cache_keys_a_kernel_by_torchs_version_not_its_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert key_kernels_by_torch_version() and key_kernels_by_torch_version()  # installs once, then says so
    assert not getattr(codecache.write.__wrapped__, "aieng_keyed", False)  # wrapped once, not twice
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    build = f"{torch.__version__} {torch.version.git_version}"
    source = 'extern "C" int aieng_probe() { return 1; }'
    here, _ = codecache.write(source, "cpp", extra=f"-I{torch_dir}/include -L{sys.prefix}/lib")
    anywhere, _ = codecache.write(source, "cpp", extra=f"-I<torch {build}>/include -L<environment>/lib")
    elsewhere, _ = codecache.write(source, "cpp", extra=f"-I/opt/other/torch/include -L{sys.prefix}/lib")
    assert here == anywhere and here != elsewhere
