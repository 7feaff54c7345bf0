"""fp32 weights in oneDNN's blocked layout, for the steps that are bound by arithmetic.

At batch 32 a decode step of a real model is matrix multiplies: in a profile of the
smollm2-135m shape, ``aten::mm``/``addmm`` take most of a step. PyTorch's
``F.linear`` reads the weight in its plain row-major layout and re-blocks it for the kernel on
every call; oneDNN can reorder a weight once into the blocked layout its kernel reads
(``mkldnn._reorder_linear_weight``) and then multiply straight from it
(``mkldnn._linear_pointwise``), which saves the re-blocking at every row count the format plan
times (the ``engine_weight_formats`` log line has the timings). The product is the same fp32
arithmetic summed in another order (differences ~1e-6).

The packed tensor is in MKLDNN layout, which a compiled graph cannot take as an input. So the
graph keeps the plain weight as its input and calls ``aieng::packed_linear``, an opaque op that
looks the packed copy up by the plain weight's storage and multiplies with it (or with the plain
weight, for fewer rows than ``min_rows`` or a weight with no packed copy). The graphs and their
guards are those of plain fp32 weights; only which kernel runs inside the op differs.

The same holds for bf16 weights on a CPU with AVX-512 bf16 instructions. A copy costs as much
memory as the matrices it copies; ``formats.measure_format_plan`` asks for it only when it is
faster here and fits (``FormatPlan.packed_from``). CPU only: on a GPU the weights stay as they
are.
"""

from __future__ import annotations

import functools
import threading
import weakref

import torch
import torch.nn.functional as F

_packed: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}  # (data_ptr, shape) -> packed copy
_lock = threading.Lock()
PACK_ROWS_HINT = 32  # the row count oneDNN picks the blocked layout for (it serves every count)


def available() -> bool:
    """Whether this PyTorch has oneDNN's packed linear (CPU builds with mkldnn)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


@functools.cache
def supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies ``dtype`` weights on this CPU (tried once on a small
    matrix: bf16 needs AVX-512 bf16 or AMX, and raises elsewhere)."""
    if not available():
        return False
    try:
        with torch.inference_mode():
            w = torch.ones(16, 16, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT)
            out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=dtype), packed, None, "none", [], "")
        return bool((out.float() == 16).all())
    except RuntimeError:
        return False


def _key(weight: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    return weight.data_ptr(), tuple(weight.shape)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """Register a packed copy of the fp32 or bf16 CPU matrix ``weight`` [out, in] and return it
    (bf16 needs a CPU whose oneDNN kernels take bf16: it raises RuntimeError elsewhere). The copy
    is dropped when ``weight`` is freed, so a swapped-out model takes its copies with it and a new
    tensor at the same address never meets a stale one."""
    if weight.dtype not in (torch.float32, torch.bfloat16) or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(
            f"only 2-D fp32 or bf16 CPU weights are packed, not {weight.dtype} {tuple(weight.shape)} on {weight.device}"
        )
    with torch.inference_mode():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)
    key = _key(weight)
    with _lock:
        _packed[key] = packed
    weakref.finalize(weight, _forget, key, id(packed))  # the id, not the tensor: unpack frees it at once
    return packed


def unpack(weight: torch.Tensor) -> None:
    """Drop ``weight``'s packed copy now (steps then multiply with the plain weight)."""
    with _lock:
        _packed.pop(_key(weight), None)


def _forget(key, packed_id: int) -> None:
    with _lock:
        if id(_packed.get(key)) == packed_id:
            del _packed[key]


def packed_bytes() -> int:
    with _lock:
        return sum(weight_bytes(t) for t in _packed.values())


def weight_bytes(packed: torch.Tensor) -> int:
    return packed.numel() * packed.element_size()


def is_packed(weight: torch.Tensor) -> bool:
    with _lock:
        return _key(weight) in _packed


def packed_linear(x: torch.Tensor, weight: torch.Tensor, min_rows: int) -> torch.Tensor:
    """``x @ weight.T`` [N, out] from x [N, in] of the weight's dtype: from ``min_rows`` rows with
    ``weight``'s packed copy when it has one, otherwise (and below) ``F.linear``. The caller
    casts (``native_llama.linear``), so in a compiled graph the casts fuse with their neighbours."""
    packed = _packed.get(_key(weight)) if x.shape[0] >= min_rows else None
    if packed is None:
        return F.linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


# Registered with the dispatcher directly (a CPU kernel and a fake for tracing): a step calls it
# four times per layer, and ``torch.library.custom_op``'s wrapper cost twice as much per call.
_library = torch.library.Library("aieng", "FRAGMENT")
_library.define("packed_linear(Tensor x, Tensor weight, int min_rows) -> Tensor")
_library.impl("packed_linear", packed_linear, "CPU")


@torch.library.register_fake("aieng::packed_linear")
def _(x: torch.Tensor, weight: torch.Tensor, min_rows: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
