"""aieng's own CPU kernels, compiled on the serving host the first time they are needed.

- ``torch.ops.aieng.decode_attention`` (``decode_attention.cpp``), the decode step's attention
  over the static KV cache. PyTorch's CPU ``scaled_dot_product_attention`` is built for prefill:
  for a decode query of a few rows it reads the cache at well under the machine's memory
  bandwidth, and at batch 1 it has only as many units of work as KV heads. At long context that
  read is what a decode step grows by (``aieng bench context``).
- ``torch.ops.aieng.matvec``, ``matvec_int8`` and ``matvec_int4`` (``matvec.cpp``), a few rows times a weight
  matrix: the projections of a batch-1 step, which read every weight once and are bound by how
  fast the weights stream (``aieng bench memory`` measures the ceiling; ``aieng bench engine``
  reports a batch-1 step's share of it).

Why compiled here and not shipped: the kernel is vectorised for the CPU it runs on (AVX2 or
AVX-512), against the torch it is loaded into. It is built with the same C++ compiler
``torch.compile`` already needs, once per host (the log says how long it took): the library lands
in the compile cache directory (``TORCHINDUCTOR_CACHE_DIR``, which ``aieng serve`` points at
``AIENG_COMPILE_CACHE_DIR``),
named by a hash of the source, the flags, the torch version and the compiler, so a restart loads
it and a changed host builds its own. A host that cannot build it (no compiler) serves with
PyTorch's attention and says so once in the log: slower at long context, never wrong.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from aieng.engine.compile_keys import torch_build, without_environment

log = logging.getLogger("aieng.engine")

# Largest first: they compile side by side, so the last to start is a short one.
SOURCES = tuple(Path(__file__).with_name(name) for name in ("one_row.cpp", "matvec.cpp", "decode_attention.cpp"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("attention_kernels.h", "matvec_kernels.h"))
MATVEC_MAX_ROWS = 4  # matvec.cpp's kMaxRows
BUILD_TIMEOUT_S = 600

_lock = threading.Lock()
_state: dict = {"loaded": False, "error": None}


def cache_dir() -> Path:
    """Where built kernels live: beside torch.compile's own cache."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return Path(inductor_cache_dir()) / "aieng-kernels"


def arch_flags() -> list[str]:
    """Vector-unit flags for this CPU, from what PyTorch itself detected (its ``Vectorized``
    headers need the matching ``CPU_CAPABILITY`` macro). Plain C++ elsewhere (ARM, old x86)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return [
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512dq",
            "-mfma",
            "-mf16c",
            *(["-mavx512vnni"] if "avx512_vnni" in cpu_flags() else []),  # 4-bit weights' integer dot products
            "-DCPU_CAPABILITY=AVX512",
            "-DCPU_CAPABILITY_AVX512",
        ]
    if capability == "AVX2":
        return ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return []


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere): for the few instructions
    PyTorch's capability level does not imply, such as AVX-512 VNNI."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _compile_flags() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return [
        "-O3",
        "-std=c++17",
        "-w",
        "-fPIC",
        "-fopenmp",
        *arch_flags(),
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{p}" for p in include_paths()),
    ]


def build_commands(cxx: str, output: Path, work: Path) -> tuple[list[list[str]], list[str]]:
    """One compiler call per source (each parses ATen's headers, most of a build's time, so they
    run side by side, one per core) and the call that links their objects into ``output``."""
    from torch.utils.cpp_extension import library_paths

    lib = library_paths()[0]
    objects = [work / f"{source.stem}.o" for source in SOURCES]
    compiles = [[cxx, *_compile_flags(), "-c", str(s), "-o", str(o)] for s, o in zip(SOURCES, objects)]
    link = [cxx, "-shared", "-fopenmp", *map(str, objects), "-o", str(output)]
    return compiles, [*link, f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]


def library_path(cxx: str) -> Path:
    """The library's name: a hash of what goes into it. The sources count by content and torch by
    its version, not by where they lie, so another checkout, virtual environment or install of the
    same aieng and torch (a fresh clone, a new release directory, a rebuilt image on a kept cache
    volume) loads the library instead of building it again."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES + HEADERS))
    places = {str(source): source.name for source in SOURCES}
    compiles, link = build_commands(cxx, Path("out"), Path("objects"))
    command = " && ".join(" ".join(places.get(part, part) for part in call) for call in [*compiles, link])
    for part in (without_environment(command), torch_build(), version):  # inductor's kernels: the same rule
        key.update(part.encode())
    return cache_dir() / f"aieng_kernels-{key.hexdigest()[:16]}.so"


def _build(cxx: str, target: Path) -> None:
    """Compile into a temporary file beside ``target``, then rename: a crash or a second worker
    building at the same time never leaves a half-written library under the final name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    started = time.monotonic()
    log.info("building aieng's CPU kernels (once per host and torch version): %s", target.name)
    try:
        with tempfile.TemporaryDirectory(prefix=target.stem + ".", suffix=".objects.tmp", dir=target.parent) as work:
            compiles, link = build_commands(cxx, Path(tmp), Path(work))
            with ThreadPoolExecutor(max_workers=min(len(compiles), os.cpu_count() or 1)) as pool:
                list(pool.map(_run, compiles))
            _run(link)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("built the CPU kernels (decode attention, matvec, the one-row step) in %.1f s", time.monotonic() - started)


def _run(call: list[str]) -> None:
    done = subprocess.run(call, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{call[0]} exited {done.returncode}: {done.stderr.strip()[-1500:]}")


def load() -> str | None:
    """Build (if needed) and load the kernels into this process. None when they are loaded;
    otherwise why not (the caller then uses PyTorch's attention and ``F.linear``). Thread-safe,
    once per process."""
    with _lock:
        if _state["loaded"] or _state["error"]:
            return _state["error"]
        try:
            cxx = compiler()
            if cxx is None:
                raise RuntimeError("no C++ compiler (set CXX, or install g++)")
            target = library_path(cxx)
            if not target.exists():
                _build(cxx, target)
            torch.ops.load_library(str(target))
            torch.library.register_fake("aieng::decode_attention")(_decode_attention_shape)
            torch.library.register_fake("aieng::matvec")(_matvec_shape)
            torch.library.register_fake("aieng::matvec_int8")(_matvec_int8_shape)
            torch.library.register_fake("aieng::matvec_int4")(_matvec_int8_shape)
            torch.library.register_fake("aieng::one_row_layers")(_one_row_layers_shape)
            _state["loaded"] = True
        except Exception as exc:  # noqa: BLE001 - any failure means: serve with PyTorch's attention
            _state["error"] = f"{type(exc).__name__}: {exc}"
            log.warning(
                "aieng's CPU kernels are unavailable, using PyTorch's attention and matrix "
                "products (slower at long context and at batch 1): %s",
                _state["error"],
            )
        return _state["error"]


def _decode_attention_shape(query, keys, values, positions, first, scale):
    return torch.empty_like(query)


def _matvec_shape(x, weight):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _matvec_int8_shape(x, weight, scales):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _one_row_layers_shape(x, cos, sin, position, slot, layers, keys, values, heads, kv_heads, head_dim, eps):
    return torch.empty_like(x)


def matvec_fits(weight: torch.Tensor) -> bool:
    """The matrices ``aieng::matvec`` takes: float32 or bfloat16 on the CPU, contiguous, with a row
    a whole number of the widest vector (16 floats); every other one goes through ``F.linear``."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and weight.dim() == 2
        and weight.shape[1] % 16 == 0
        and weight.is_contiguous()
    )


def supports(head_dim: int) -> bool:
    """The kernel's head width: a multiple of the widest vector (16 floats) up to 256."""
    return head_dim % 16 == 0 and 0 < head_dim <= 256
