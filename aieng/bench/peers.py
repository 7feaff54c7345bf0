"""The servers ``aieng bench serve --peer ...`` measures beside aieng, on the same model and load.

Peers (``--peer`` is repeatable and takes comma lists; ``--peer-format`` applies to the GGUF ones):

- ``transformers``: ``transformers serve <folder> --continuous-batching`` (the HF reference).
- ``llama.cpp``: llama.cpp's own ``llama-server`` binary, what CPU users run: ``-np`` parallel
  slots decoded together (continuous batching), ``-t`` compute threads. It serves a GGUF file that
  :mod:`aieng.bench.gguf_export` writes from the model folder (f32, bf16, q8_0 or q4_0), cached by model hash.
- ``llama-cpp-python``: ``python -m llama_cpp.server`` on the same GGUF. It holds one global lock
  around the model, so it serves **one request at a time** (at C=32 the others queue in the lock;
  with its default ``interrupt_requests`` a new request would even cut the running stream, which
  the bench turns off). It is measured because it is what ``pip install`` gives; the batching
  comparison is against ``llama.cpp``.

The pip package builds llama.cpp's libraries but not ``llama-server``; :func:`build_llama_server`
builds that one target from the same source (the sdist's vendored llama.cpp), see
:data:`LLAMA_SERVER_HINT`. A peer that is not installed is skipped with the exact install command.

Each peer runs as a :class:`~aieng.bench.server_process.ServerProcess` (free loopback port, its own
session, SIGTERM at exit and when the bench dies), with its output in a temp log file.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from aieng.bench.server_process import ServerProcess

PEER_KINDS = ("transformers", "llama.cpp", "llama-cpp-python")
GGUF_KINDS = ("llama.cpp", "llama-cpp-python")
#: The exact pins of the ``peers`` extra in pyproject.toml (kept equal by tests/bench/test_peers.py).
LLAMA_CPP_PYTHON = "llama-cpp-python[server]==0.3.36"
LLAMA_CPP_PYTHON_HINT = (
    f"install it with: .venv/bin/pip install '{LLAMA_CPP_PYTHON}'  (or: pip install -e '.[peers]'; "
    "it builds llama.cpp, minutes; where ggml's AMX path faults (SIGILL), first export "
    'CMAKE_ARGS=\'-DGGML_NATIVE=ON -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" '
    '-DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"\')'
)
LLAMA_SERVER_HINT = (
    "no llama-server binary ($AIENG_LLAMA_SERVER, PATH, or beside this Python); build it from the "
    "llama-cpp-python sdist's vendored llama.cpp (cmake and a C++ compiler, ~15 min on 2 cores) with: "
    ".venv/bin/python -m aieng.bench.peers build-llama-server"
)
TRANSFORMERS_HINT = "install the dev extra: pip install -e '.[dev]' (transformers serve needs accelerate)"


class PeerUnavailable(RuntimeError):
    """The peer is not installed here; the message says how to install it."""


@dataclass(frozen=True)
class PeerSpec:
    kind: str
    fmt: str | None = None  # f32 | q8_0 for the GGUF peers

    @property
    def label(self) -> str:
        if self.kind == "transformers":
            return "transformers_cb"
        return f"{self.kind}_{self.fmt}"


def parse_peers(values: list[str] | None, formats: str = "f32") -> list[PeerSpec]:
    """``--peer`` values (repeated and/or comma lists) x ``--peer-format`` (comma list) -> specs.

    A GGUF peer may carry its own format (``llama.cpp:q8_0``), which then replaces ``--peer-format``.
    """
    from aieng.bench.gguf_export import FORMATS

    default_formats = [f.strip() for f in formats.split(",") if f.strip()]
    for fmt in default_formats:
        if fmt not in FORMATS:
            raise ValueError(f"--peer-format {fmt!r}: choose from {', '.join(FORMATS)}")
    specs: list[PeerSpec] = []
    for value in values or []:
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            kind, _, fmt = item.partition(":")
            if kind not in PEER_KINDS:
                raise ValueError(f"--peer {kind!r}: choose from {', '.join(PEER_KINDS)}")
            if kind == "transformers":
                if fmt:
                    raise ValueError("--peer transformers takes no format (it serves the safetensors folder)")
                new = [PeerSpec(kind)]
            elif fmt and fmt not in FORMATS:
                raise ValueError(f"--peer {item!r}: format {fmt!r}, choose from {', '.join(FORMATS)}")
            else:
                new = [PeerSpec(kind, f) for f in ([fmt] if fmt else default_formats)]
            specs += [s for s in new if s not in specs]
    return specs


def peer_threads(requested: int = 0, model_dir: Path | None = None) -> int:
    """Compute threads for a peer: ``requested``, else what one aieng worker's torch gets here for
    this model (``$AIENG_TORCH_THREADS``, else the worker plan for ``--workers 1``)."""
    from aieng.server.process.worker_plan import plan_workers

    if requested:
        return requested
    if int(os.environ.get("AIENG_TORCH_THREADS", "0") or 0):
        return int(os.environ["AIENG_TORCH_THREADS"])
    weights = f32_weight_bytes(model_dir) if model_dir is not None else 0
    return plan_workers(
        cores=os.cpu_count() or 1, available_bytes=1 << 40, weight_bytes=weights, per_worker_bytes=1, requested=1
    ).torch_threads


def f32_weight_bytes(model_dir: Path) -> int:
    """The weights' size as aieng holds them on CPU (float32), from the safetensors headers alone."""
    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return 4 * total


def peer_body_extra(kind: str | bool, max_tokens: int, eos_id: int | None) -> dict:
    """Each server's own way of generating exactly ``max_tokens`` (EOS ignored), greedy.

    transformers serve refuses unknown fields (422), so each body carries only its server's.
    """
    if kind in (True, "transformers"):
        return {
            "generation_config": json.dumps(
                {"max_new_tokens": max_tokens, "min_new_tokens": max_tokens, "do_sample": False}
            )
        }
    if kind == "llama.cpp":
        return {"ignore_eos": True}
    if kind == "llama-cpp-python":  # no ignore_eos: a logit bias that EOS never wins against
        return {"logit_bias": {str(eos_id): -1e9}} if eos_id is not None else {}
    return {"ignore_eos": True}  # aieng


# ---------------------------------------------------------------------------------------------
# processes


@dataclass
class PeerServer(ServerProcess):
    """A :class:`ServerProcess` for a command that is not ``aieng serve``.

    ``argv`` may contain ``{port}``, filled with the free port at start; ``health_path`` answers
    200 once the model is loaded.
    """

    store: Path = Path(".")
    name: str = "peer"
    argv: list[str] = field(default_factory=list)
    health_path: str = "/health"

    def command(self) -> list[str]:
        return [a.replace("{port}", str(self.port)) for a in self.argv]


def find_llama_server() -> str | None:
    for candidate in (
        os.environ.get("AIENG_LLAMA_SERVER"),
        shutil.which("llama-server"),
        str(Path(sys.executable).parent / "llama-server"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def llama_cpp_python_missing() -> list[str]:
    return [
        m
        for m in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings")
        if importlib.util.find_spec(m) is None
    ]


def check_available(spec: PeerSpec) -> None:
    """Raise :class:`PeerUnavailable` with the install command when ``spec`` cannot run here."""
    if spec.kind == "transformers":
        exe = shutil.which("transformers") or Path(sys.executable).parent / "transformers"
        if not Path(exe).is_file() or importlib.util.find_spec("accelerate") is None:
            raise PeerUnavailable(f"transformers serve is not installed; {TRANSFORMERS_HINT}")
    elif spec.kind == "llama-cpp-python" and (missing := llama_cpp_python_missing()):
        raise PeerUnavailable(
            f"llama-cpp-python is not installed (missing {', '.join(missing)}); {LLAMA_CPP_PYTHON_HINT}"
        )
    elif spec.kind == "llama.cpp" and find_llama_server() is None:
        raise PeerUnavailable(f"llama.cpp: {LLAMA_SERVER_HINT}")


def peer_server(
    spec: PeerSpec, *, model_dir: Path, gguf: Path | None, threads: int, slots: int, slot_ctx: int
) -> PeerServer:
    """The (unstarted) server for ``spec``; use it as a context manager."""
    if spec.kind == "transformers":
        exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
        return PeerServer(
            name="transformers serve",
            health_path="/health",
            argv=[
                exe,
                "serve",
                str(model_dir),
                "--continuous-batching",
                "--host",
                "127.0.0.1",
                "--port",
                "{port}",
                "--device",
                "cpu",
            ],
        )
    if spec.kind == "llama.cpp":
        # -np slots share one KV cache of slots x slot_ctx cells; continuous batching is on by default
        return PeerServer(
            name="llama-server",
            health_path="/health",
            argv=[
                find_llama_server(),
                "--model",
                str(gguf),
                "--host",
                "127.0.0.1",
                "--port",
                "{port}",
                "--threads",
                str(threads),
                "--threads-batch",
                str(threads),
                "--parallel",
                str(slots),
                "--ctx-size",
                str(slots * slot_ctx),
                "--cont-batching",
                "--no-webui",
            ],
        )
    return PeerServer(
        name="llama_cpp.server",
        health_path="/v1/models",
        argv=[
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--n_ctx",
            str(slot_ctx),
            "--interrupt_requests",
            "False",
        ],
    )


@contextlib.contextmanager
def connection_per_request(on: bool = True):
    """The load client opens a new connection for every request while this is active.

    llama-server (its cpp-httplib) answers a streamed response with ``Keep-Alive`` and then closes
    the connection; aiohttp re-uses it for the next POST and fails with "Can not write request
    body" (every other request). :mod:`aieng.bench.load` builds its own ``TCPConnector``, so this
    swaps in one with ``force_close`` (a new loopback connection costs little beside a
    generation).
    """
    if not on:
        yield
        return
    from unittest import mock

    import aiohttp

    with mock.patch.object(aiohttp, "TCPConnector", functools.partial(aiohttp.TCPConnector, force_close=True)):
        yield


# ---------------------------------------------------------------------------------------------
# building llama-server


def build_llama_server(
    dest: Path | None = None,
    work: Path = Path("/tmp/aieng-llama-server-build"),
    jobs: int | None = None,
    amx: bool = False,
) -> Path:
    """Build llama.cpp's ``llama-server`` from the llama-cpp-python sdist (the same llama.cpp the
    pinned wheel builds) and copy the static binary to ``dest`` (default: beside this Python)."""
    import tarfile

    dest = dest or Path(sys.executable).parent / "llama-server"
    work.mkdir(parents=True, exist_ok=True)
    sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        pin = LLAMA_CPP_PYTHON.replace("[server]", "")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", pin, "-d", str(work)],
            check=True,
        )
        sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    src = work / sdists[-1].name.removesuffix(".tar.gz")
    if not src.is_dir():
        with tarfile.open(sdists[-1]) as tar:
            tar.extractall(work, filter="data")
    llama_src, build = src / "vendor" / "llama.cpp", work / "build"
    flags = [] if amx else [f"-DCMAKE_{lang}_FLAGS={NO_AMX}" for lang in ("C", "CXX")]
    subprocess.run(
        [
            "cmake",
            "-S",
            str(llama_src),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_UI=OFF",
            *flags,
        ],
        check=True,
    )
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs or os.cpu_count() or 1)], check=True
    )
    shutil.copy2(build / "bin" / "llama-server", dest)
    return dest


#: -march=native turns AMX on where the CPU lists it. ggml's AMX int8 path (q8_0 matmuls) died with
#: SIGILL (``tilezero`` on a tile its thread had not configured) on the Sapphire Rapids VM this was
#: built on, though a standalone AMX program ran there; these flags leave AMX out (ggml then uses its
#: AVX-512 VNNI kernels). ``build_llama_server(amx=True)`` keeps it.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


if __name__ == "__main__":  # python -m aieng.bench.peers build-llama-server [DEST]
    if sys.argv[1:2] != ["build-llama-server"]:
        sys.exit("usage: python -m aieng.bench.peers build-llama-server [DEST]")
    print(build_llama_server(Path(sys.argv[2]) if len(sys.argv) > 2 else None))
