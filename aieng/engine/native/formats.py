"""Which weight format a step runs in, chosen by measuring this machine, not assumed.

A decode step at batch 1 reads every weight once for little arithmetic: it is bound by how fast
the weights stream from memory, where bf16 (half the bytes) can win. At batch 32 it is bound by
arithmetic, where the winner depends on the CPU: without bf16 matrix units (AVX2) bf16 matrix
multiplies are far slower than fp32, while a CPU with AMX runs bf16 faster than fp32 at batch 32
and can lose at batch 1 (the realistic-shape issue's notes have both measurements). No single
format wins everywhere, and which wins where is a property of the machine, so the engine
measures it.

``measure_format_plan`` times the decoder layers' matrices (fused as the native forward runs
them) at 1..64 tokens in both formats (runs interleaved, medians), over the layers in turn as a
step reads them: one layer alone would be served from the cache. It returns a ``FormatPlan``:
for each measured token count, the faster format; a step uses the plan's choice for the largest
measured count not above its own token count.

Each format also has a second layout: its matrices reordered once into oneDNN's blocked layout
(``packed_weights``), which multiplies faster from a few rows up than ``F.linear`` re-blocking
the plain matrix on every call (on an AVX-512 CPU, in both formats; the ``engine_weight_formats``
log line says from which size on this one). Both are timed beside the plain ones; the plan's
``packed_from`` is the token count from which the winner is packed at every measured count (0:
never, and no copy is kept: a packed copy costs as much memory as the matrices it copies).

Those eager timings say nothing about the compiled one-row step, whose matrix-vector kernel
inductor generates (``native_llama.streamed_matvec``): the runner times that graph in both
formats when it builds it. The engine keeps a bf16 copy of the layers only while some step may
use it (it costs half the fp32 weights' memory). Quality: ``aieng eval --dtype bfloat16`` records
the accuracy of bf16 weights beside fp32 in the manifest.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from aieng.engine.native import format_plan_cache, packed_weights
from aieng.engine.native.quantized import FORMATS as QUANTIZED_FORMATS
from aieng.engine.native.quantized import fits_format, quantize_matrix, quantized_matvec, row_multiple
from aieng.host import container_limits
from aieng.settings import WEIGHT_FORMATS

log = logging.getLogger("aieng.engine")

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64)
STREAMED_TOKENS = 8  # up to here a step is bound by memory bandwidth; above, by arithmetic
STREAMED_BYTES = 1 << 30  # fp32 bytes of matrices timed: beyond any CPU cache, as a step reads them
# A second format must also save this much per step, whole model: each format that runs through
# oneDNN (bf16 on an AVX-512 CPU, any packed copy) keeps a built kernel per weight shape and row
# count (onednn_caches.py: some hundreds of KiB each, and a rebuild when one is evicted), and bf16
# costs accuracy. A saving below this (a model as small as the demo) is not worth caches that fill
# after the load test's warm-up; a model of realistic size saves far more (the
# ``engine_weight_formats`` log line has the timings).
MIN_SAVING_S = 0.5e-3
CLEAR_MARGIN = 1.5  # FormatPlan.clear_at_one_row


@dataclass(frozen=True)
class FormatPlan:
    """``bf16_from``: (token count, use bf16) from that count up, ascending; empty = fp32 always.
    ``measured``: chosen by measurement (``auto``) with room for a bf16 copy, so the compiled
    one-row graph may time both formats for itself (``NativeRunner.build_graphs``).
    ``packed_from``: steps of at least this many tokens multiply from oneDNN-packed copies of
    the matrices of their format (``packed_weights``); 0: never."""

    bf16_from: tuple[tuple[int, bool], ...] = ()
    measured: bool = False
    packed_from: int = 0
    # Measured plans: the eager one-token step's fp32 time over its bf16 time (each format's faster
    # layout). Far from 1, the compiled one-row graphs need no race of their own (``clear_at_one_row``).
    one_row_margin: float | None = field(default=None, compare=False)
    # Steps of up to this many tokens read the copy in the quantised format ``quantized`` (``int8``
    # or ``int4``; 0: no copy), when it beat the float formats on this machine (``quantized_plan``).
    quantized_rows: int = 0
    quantized: str = ""

    @classmethod
    def fixed(cls, bf16: bool) -> FormatPlan:
        return cls(((1, bf16),))

    def use_bf16(self, tokens: int) -> bool:
        choice = False
        for count, bf16 in self.bf16_from:
            if count > tokens:
                break
            choice = bf16
        return choice

    @property
    def clear_at_one_row(self) -> bool:
        """One format wins the eager one-token step by ``CLEAR_MARGIN`` or more: compiled, where both
        stream the weights through the same kernel, the one reading fewer bytes per weight cannot
        turn into the loser, so only the winner's graph is built (a cold start compiles one graph
        less, which on a model of realistic size is the longest compile of the start)."""
        margin = self.one_row_margin
        return margin is not None and (margin >= CLEAR_MARGIN or margin <= 1 / CLEAR_MARGIN)

    @property
    def uses_bf16(self) -> bool:
        return any(bf16 for _, bf16 in self.bf16_from)

    @property
    def uses_fp32(self) -> bool:
        """Some step size runs in fp32 (an empty plan: every one)."""
        return not self.bf16_from or not all(bf16 for _, bf16 in self.bf16_from)

    def formats_from(self, tokens: int) -> set[bool]:
        """The formats (bf16 or not) steps of ``tokens`` or more run in: the copies to pack."""
        return {bf16 for count, bf16 in self.bf16_from if count > tokens} | {self.use_bf16(tokens)}

    def describe(self) -> str:
        suffix = f" (oneDNN-packed from {self.packed_from} tokens)" if self.packed_from else ""
        if self.quantized_rows:
            rows = self.quantized_rows
            suffix += f"; {self.quantized} weights for steps of {rows} token{'s' if rows > 1 else ''}"
        if not self.uses_bf16:
            return f"fp32 weights for {'larger steps' if self.quantized_rows else 'every step'}{suffix}"
        parts = [
            f"{'bf16' if bf16 else 'fp32'} from {count} token{'s' if count > 1 else ''}"
            for i, (count, bf16) in enumerate(self.bf16_from)
            if i == 0 or bf16 != self.bf16_from[i - 1][1]
        ]
        return ", ".join(parts) + suffix


def format_plan(choice: str, model) -> FormatPlan:
    """One of ``WEIGHT_FORMATS`` as a plan for ``model``: ``auto`` is measured on this machine; a
    ``-packed`` format multiplies from oneDNN-packed copies at every step size (on the CPU)."""
    if choice == "auto":
        return measure_format_plan(model)
    if choice in QUANTIZED_FORMATS:
        return quantized_plan(model, measure_format_plan(model), choice)
    if choice not in WEIGHT_FORMATS:
        raise ValueError(f"weight formats {choice!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    bf16, packed = choice.startswith("bfloat16"), choice.endswith("-packed")
    if packed and not packed_weights.supports(torch.bfloat16 if bf16 else torch.float32):
        from aieng.errors import ConfigError

        raise ConfigError(
            f"weight formats {choice!r}: this PyTorch/CPU cannot pack "
            f"{'bf16' if bf16 else 'fp32'} weights with oneDNN (bf16 needs AVX-512); use auto, "
            f"which measures what this machine can run"
        )
    return replace(FormatPlan.fixed(bf16) if bf16 else FormatPlan(), packed_from=1 if packed else 0)


def measure_format_plan(model, *, repeats: int = 5, cached: bool = True) -> FormatPlan:
    """``cached``: take the plan an earlier start measured under the same conditions, and keep
    this one for the next (``format_plan_cache``)."""
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return FormatPlan()  # on a GPU, or in fp16: one format
    kept_bf16 = weight.dtype == torch.bfloat16  # a bf16 checkpoint kept as it is (device.choose_dtype)
    params = sum(p.numel() for p in model.parameters())
    copy_bytes = params * (4 if kept_bf16 else 2)  # the other format's copy
    available = container_limits.limits().memory_available_bytes  # a container's limit, when tighter
    if copy_bytes > available * 0.5:
        log.info(
            "no %s weight copy: it would take %.0f MiB of %.0f MiB available",
            "fp32" if kept_bf16 else "bf16",
            copy_bytes / 2**20,
            available / 2**20,
            extra={"event": "engine_weight_formats"},
        )
        return FormatPlan.fixed(True) if kept_bf16 else FormatPlan()
    # Packed copies are as large as the weights they copy: timed (and kept) only when they fit.
    try_packed = packed_weights.available() and params * 8 <= available * 0.5
    # The matrices are timed over the layers in turn, as a step reads them: one layer's would sit in
    # the last-level cache (hundreds of MiB on a server CPU), where fp32 looks as cheap as bf16
    # at a few tokens and the plain layouts' per-call re-blocking looks free at many (on one layer
    # packed bf16 can even lose to plain where it wins clearly on all of them).
    per_layer = [_layer_matrices(layer) for layer in model.model.layers]
    streamed_layers = _streamed_layers(per_layer)
    path = format_plan_cache.plan_path(
        [tuple(m.shape) for m in per_layer[0]],
        len(per_layer),
        packed=try_packed,
        rules={
            "tokens": TOKEN_COUNTS,
            "min_saving_s": MIN_SAVING_S,
            "streamed_bytes": STREAMED_BYTES,
            "repeats": repeats,
        },
    )
    kept = format_plan_cache.load(path) if cached else None
    if kept is not None:
        result = FormatPlan(
            kept["bf16_from"],
            measured=True,
            packed_from=kept["packed_from"],
            one_row_margin=one_row_margin(kept["timings"]),
        )
        log.info(
            "weight formats: %s (measured at %s on this CPU and thread count, kept in %s: delete it to measure again)",
            result.describe(),
            kept["measured_at"],
            path,
            extra={"event": "engine_weight_formats", "plan": result.describe(), "cached": True},
        )
        return result
    timed = [m for matrices in per_layer[:streamed_layers] for m in matrices]
    timings = {}
    with torch.inference_mode():
        fp32, bf16 = [m.float() for m in timed], [m.to(torch.bfloat16) for m in timed]
        packed = _pack_all(fp32 + bf16) if try_packed else []
        try:
            for tokens in TOKEN_COUNTS:
                rounds = repeats if tokens <= STREAMED_TOKENS else max(1, repeats - 2)  # slower runs, less noise
                timings[tokens] = _time_formats(fp32, bf16, tokens, rounds, packed=bool(packed))
        finally:
            for m in packed:  # the engine packs its own fused matrices if the plan asks for them
                packed_weights.unpack(m)
    scale = len(per_layer) / streamed_layers  # the timed layers' seconds -> a whole step's
    timings = {tokens: tuple(t * scale for t in times) for tokens, times in timings.items()}
    result = plan_from_timings(timings)
    log.info(
        "weight formats: %s (µs a step in fp32/bf16%s by tokens, %d of %d layers timed: %s)",
        result.describe(),
        "/packed fp32/packed bf16" if packed else "",
        streamed_layers,
        len(per_layer),
        {tokens: tuple(round(s * 1e6) for s in times) for tokens, times in timings.items()},
        extra={"event": "engine_weight_formats", "plan": result.describe()},
    )
    if cached:
        format_plan_cache.store(path, result.bf16_from, result.packed_from, timings)
    return result


def quantized_plan(model, plan: FormatPlan, name: str, *, repeats: int = 5) -> FormatPlan:
    """``plan`` with one-token steps on weights in the quantised format ``name`` (``int8``,
    ``int4``), if they beat the float formats there: the decoder layers' matrices times one row,
    through aieng's kernels, the quantised format against the faster of
    fp32 and bf16 (the same bar as bf16 over fp32). Refused, with a log line, where they lose; an
    error where they cannot run (no kernels, a GPU, rows the kernel cannot take)."""
    from aieng.engine.native import kernels
    from aieng.errors import ConfigError

    weight = next(model.parameters())
    why_not = f"{name} weights run on the CPU" if weight.device.type != "cpu" else kernels.load()
    matrices = [_layer_matrices(layer) for layer in model.model.layers]
    if why_not is None and not all(fits_format(name, m) for m in matrices[0]):
        why_not = f"a weight row is not a multiple of {row_multiple(name)} weights"
    if why_not is not None:
        raise ConfigError(f"weight formats {name!r}: not on this host ({why_not}); use auto")
    timed = [m for layer in matrices[: _streamed_layers(matrices)] for m in layer]
    with torch.inference_mode():
        timed, bf16 = [m.float() for m in timed], [m.to(torch.bfloat16) for m in timed]
        stored = [quantize_matrix(name, m) for m in timed]
        x = {m.shape[1]: torch.randn(1, m.shape[1]) for m in timed}
        times = interleaved_medians(
            lambda: [torch.ops.aieng.matvec(x[m.shape[1]], m) for m in timed],
            lambda: [torch.ops.aieng.matvec(x[m.shape[1]], m) for m in bf16],
            lambda: [quantized_matvec(x[m.shape[1]], q, s) for m, (q, s) in zip(timed, stored)],
            rounds=repeats,
        )
    chosen = quantized_wins(min(times[:2]), times[2])
    log.info(
        "%s weights %s for one-token steps (the layers' matrices at one row: fp32 %.2f ms, bf16 %.2f ms, "
        "%s %.2f ms, %d of %d layers timed)",
        name,
        "chosen" if chosen else "refused: not clearly faster than the float formats here",
        *(t * 1e3 for t in times[:2]),
        name,
        times[2] * 1e3,
        len(timed) // 4,
        len(matrices),
        extra={
            "event": "engine_weight_formats",
            "quantized": name,
            "chosen": chosen,
            "ms": [round(t * 1e3, 3) for t in times],
        },
    )
    return replace(plan, quantized_rows=1, quantized=name) if chosen else plan


def _streamed_layers(per_layer: list[list[torch.Tensor]]) -> int:
    """How many layers to time in turn: ``STREAMED_BYTES`` of fp32 matrices, beyond any CPU cache
    (counted in fp32 whatever the weights are stored in: the same layers for either)."""
    layer_bytes = sum(m.numel() * 4 for m in per_layer[0])
    return max(1, min(len(per_layer), STREAMED_BYTES // layer_bytes))


def _pack_all(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pack every matrix, or none: a PyTorch whose oneDNN cannot reorder bf16 weights on this CPU
    (no AVX-512) raises, and then no packed format is timed."""
    done = []
    try:
        for m in matrices:
            packed_weights.pack(m)
            done.append(m)
    except RuntimeError as exc:
        log.info(
            "no packed weights: oneDNN could not pack a %s matrix here (%s)",
            m.dtype,
            str(exc).splitlines()[0],
            extra={"event": "engine_weight_formats"},
        )
        for m in done:
            packed_weights.unpack(m)
        return []
    return done


def plan_from_timings(timings: dict[int, tuple[float, ...]]) -> FormatPlan:
    """The plan from seconds (fp32, bf16[, packed fp32, packed bf16]) by token count.

    At each count the faster layout of each format (packed only where it wins clearly), then bf16
    where it clearly beats fp32. Packing starts at the smallest count from which every larger
    count's winner is packed (``packed_from``); below it the plain layouts run."""
    counts = sorted(timings)

    def winner(tokens: int, packed: bool) -> tuple[bool, bool]:  # (bf16, packed)
        times = timings[tokens]
        fp32 = (times[0], False) if not packed or not packed_wins(times[0], times[2]) else (times[2], True)
        bf16 = (times[1], False) if not packed or not packed_wins(times[1], times[3]) else (times[3], True)
        return (True, bf16[1]) if bf16_wins(fp32[0], bf16[0]) else (False, fp32[1])

    packed_from = 0
    for tokens in reversed(counts):
        if len(timings[tokens]) < 4 or not winner(tokens, packed=True)[1]:
            break
        packed_from = tokens
    plan = tuple((tokens, winner(tokens, packed=bool(packed_from) and tokens >= packed_from)[0]) for tokens in counts)
    return FormatPlan(plan, measured=True, packed_from=packed_from, one_row_margin=one_row_margin(timings))


def one_row_margin(timings: dict[int, tuple[float, ...]]) -> float | None:
    """fp32 seconds over bf16 seconds at one token, each format's faster layout (None: not timed)."""
    times = timings.get(1)
    if not times or min(times[1::2]) <= 0:
        return None
    return min(times[0::2]) / min(times[1::2])


def packed_wins(plain_s: float, packed_s: float) -> bool:
    """The packed copy must win clearly (by 5% and ``MIN_SAVING_S`` a step): it costs as much
    memory as the weights, and oneDNN's kernel caches."""
    return packed_s < 0.95 * plain_s and plain_s - packed_s >= MIN_SAVING_S


def bf16_wins(fp32_s: float, bf16_s: float) -> bool:
    """bf16 must win clearly (by 5% and ``MIN_SAVING_S`` a step): it costs accuracy, and on an
    AVX-512 CPU oneDNN's kernel caches."""
    return bf16_s < 0.95 * fp32_s and fp32_s - bf16_s >= MIN_SAVING_S


def quantized_wins(float_s: float, quantized_s: float) -> bool:
    """A quantised format must win as clearly as bf16 must over fp32 (``bf16_wins``): it costs
    more accuracy."""
    return bf16_wins(float_s, quantized_s)


def interleaved_medians(*runs: Callable[[], object], rounds: int) -> tuple[float, ...]:
    """Median seconds of each run over ``rounds`` rounds that run each in turn, after one round
    that warms the kernels up and is dropped (alternating, so a machine that drifts mid-way
    biases none of them)."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds + 1):
        for run, spent in zip(runs, times):
            start = time.perf_counter()
            run()
            spent.append(time.perf_counter() - start)
    return tuple(statistics.median(spent[1:]) for spent in times)


def _layer_matrices(layer) -> list[torch.Tensor]:
    """The layer's matrices as the native forward multiplies them: q|k|v and gate|up fused (the
    fusion is the one ``NativeLlama`` makes, in place: the modules become views of it)."""
    from aieng.engine.native.model import _layer_weights

    return list(_layer_weights(layer).matrices)


def _time_formats(
    fp32: list[torch.Tensor], bf16: list[torch.Tensor], tokens: int, repeats: int, *, packed: bool
) -> tuple[float, ...]:
    """Median seconds of all the matrices at ``tokens`` rows: fp32, bf16 and, with ``packed`` (the
    matrices have packed copies), both again through ``packed_linear`` as a step calls it."""
    x32 = {w.shape[1]: torch.randn(tokens, w.shape[1]) for w in fp32}

    def run(weights):
        return lambda: [F.linear(x32[w.shape[1]].to(w.dtype), w).float() for w in weights]

    def run_packed(weights):
        return lambda: [torch.ops.aieng.packed_linear(x32[w.shape[1]].to(w.dtype), w, 1).float() for w in weights]

    runs = [run(fp32), run(bf16)] + ([run_packed(fp32), run_packed(bf16)] if packed else [])
    return interleaved_medians(*runs, rounds=repeats)
