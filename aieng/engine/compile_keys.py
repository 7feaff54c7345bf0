"""torch.compile's C++ kernels, keyed without the folder torch is installed in.

On the CPU, inductor writes each kernel as C++, builds it with the system compiler and keeps the
library in its cache under a key hashed from the source *and the compiler's command line*
(``torch._inductor.codecache.CppCodeCache.load_async``, torch 2.13). That command line names the
include and library folders of the torch it runs in, which live inside the virtual environment:
a new environment with the same torch (a fresh clone's ``make install``, a rebuilt venv) misses
every kernel the cache holds and builds them all again, though the FX graph cache, whose keys hold
no paths, still hits. Measured with the demo's compiled step in a venv reached by a second path:
see the commit that added this module.

``key_kernels_by_torch_version()`` hashes that command line with torch's folder written as torch's
version and build, and the environment's prefix as a placeholder. The same torch in another folder
then finds the kernels; a different torch (other headers, another ABI) still gets keys of its own,
since its version is in them. Only the key changes: the compiler still runs with the real paths.
aieng's own kernel library (``engine/native/kernels``) is named with the same rule (``without_environment``).
"""

from __future__ import annotations

import os
import sys


def environment_free(text: str, torch_dir: str, prefix: str, torch_build: str) -> str:
    """``text`` with the torch folder named by ``torch_build`` and the environment's prefix by a
    placeholder (torch's folder first: it sits inside the prefix)."""
    return text.replace(torch_dir, f"<torch {torch_build}>").replace(prefix, "<environment>")


def torch_build() -> str:
    """This torch's version and the commit it was built from: what a key holds in place of its folder."""
    import torch

    return f"{torch.__version__} {getattr(torch.version, 'git_version', '')}".strip()


def without_environment(text: str) -> str:
    """``text`` (a compiler command line) with this process's torch folder and environment prefix
    replaced, as ``environment_free`` does: the part of a cache key that must not name them."""
    import torch

    return environment_free(text, os.path.dirname(os.path.abspath(torch.__file__)), sys.prefix, torch_build())


def key_kernels_by_torch_version() -> bool:
    """Install the keying in this process (once; later calls do nothing). Returns whether it is
    installed: False where this torch's cache has no ``codecache.write`` of the expected kind, and
    then the cache keeps its own keys."""
    try:
        from torch._inductor import codecache
    except ImportError:  # a torch without inductor
        return False
    write = getattr(codecache, "write", None)
    if write is None or not callable(write):
        return False
    if getattr(write, "aieng_keyed", False):
        return True

    def keyed_write(content, extension, extra="", *args, **kwargs):
        if isinstance(extra, str) and extra:
            extra = without_environment(extra)
        return write(content, extension, extra, *args, **kwargs)

    keyed_write.aieng_keyed = True
    keyed_write.__wrapped__ = write
    codecache.write = keyed_write
    return True
