"""The native runner's compiled graphs: which step shapes get one, building them, and warm-up.

Every decoder layer has the same shapes, so the stack is compiled once per *step shape* (decode
rows, prompt chunks, weight format: ``GraphShape``), not per layer, and a handful of graphs serve
every batch size (sizes are dynamic). Building them takes long on a CPU, so warm-up runs the
shapes eagerly first and builds the graphs after, within ``EngineConfig.compile_budget_s`` when
set: past it the engine serves eagerly and decode steps switch to the graphs when the background
thread is done. A hot swap's successor on weights of the same layout shares its predecessor's
graphs (``succession``) and only checks that its weights run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from aieng.engine.native.compile_marks import compile_settings, mark_cache_dynamic
from aieng.engine.native.formats import bf16_wins, interleaved_medians
from aieng.engine.native.llama import AttentionPlan, causal_decode_mask
from aieng.engine.native.quantized import format_of
from aieng.engine.native.slots import SlotKVCache

log = logging.getLogger("aieng.engine")


class GraphShape(NamedTuple):
    """A compiled graph of the decoder stack: ``rows`` decode rows (0, 1, or 2 standing for any
    count from 2), ``chunks`` prompt chunks in the same step (0, 1, or 2 for any count from 2: torch
    specialises sizes 0 and 1, so each is a graph of its own) and the weights' format (``quantized``:
    the quantised copy's format, ``int8`` or ``int4``, only ever one row; "" for the float ones)."""

    rows: int
    chunks: int
    bf16: bool
    quantized: str = ""

    @classmethod
    def of(cls, rows: int, chunks: int, bf16: bool, quantized: str = "") -> GraphShape:
        return cls(min(rows, 2), min(chunks, 2), bf16 and not quantized, quantized)

    def describe(self) -> str:
        weights = f"{self.quantized or ('bf16' if self.bf16 else 'fp32')} weights"
        if not self.rows:
            return f"a prompt chunk alone, {weights}"
        rows = "1 decode row" if self.rows == 1 else "2+ decode rows"
        chunks = ["", " and a prompt chunk", " and 2+ prompt chunks"][self.chunks]
        return f"{rows}{chunks}, {weights}"


def compile_shapes(runner) -> list[GraphShape]:
    """The graphs serving uses, most used first:
    - one decode row, in the one format build_graphs times (both, when the plan is measured and
      its eager timings do not already say which wins clearly: ``FormatPlan.clear_at_one_row``);
    - 2+ decode rows, in each format the plan uses from 2 tokens;
    - a prompt chunk alone, in each format the plan uses from 2 tokens: the prefill of a request
      that reaches an idle engine, once per request of a lone user (eager, its thirty-odd small
      operations per layer cost more than the matrices of a short prompt);
    - 2+ decode rows beside one prompt chunk, and beside several, in each format the plan uses
      from 4 tokens (2 rows and a chunk of 2): the steps of a busy server, where streams keep
      decoding while others join.
    A graph is dynamic in its sizes, so each is built at the smallest step it serves whatever
    count its format starts at: the measured plan moves between restarts, and a graph built at
    the plan's own threshold would miss the compile cache. Steps with no graph run eagerly."""
    formats = runner.formats
    if runner.quantized_rows:
        shapes = [GraphShape(1, 0, False, runner.quantized_format)]  # quantized_plan timed it against the floats
    elif formats.measured and runner.net.both_formats and not formats.clear_at_one_row:
        shapes = [GraphShape(1, 0, False), GraphShape(1, 0, True)]  # build_graphs keeps the faster
    else:
        shapes = [GraphShape(1, 0, runner.one_row_bf16)]
    thresholds = [count for count, _ in runner.formats.bf16_from]
    rows = runner.planned_rows
    if rows >= 2:
        for bf16 in _formats_from(runner, 2, [c for c in thresholds if 2 < c <= rows]):
            shapes.append(GraphShape(2, 0, bf16))
    for bf16 in _formats_from(runner, 2, [c for c in thresholds if c > 2]):
        shapes.append(GraphShape(0, 1, bf16))
    for chunks in (1, 2):
        if rows >= 2 + chunks:
            for bf16 in _formats_from(runner, 4, [c for c in thresholds if c > 4]):
                shapes.append(GraphShape(2, chunks, bf16))
    return shapes


def _formats_from(runner, smallest: int, thresholds: list[int]) -> list[bool]:
    return list(dict.fromkeys(runner.formats.use_bf16(count) for count in [smallest] + thresholds))


@torch.inference_mode()
def build_graphs(runner, progress: Callable[[str], None] = lambda detail: None) -> float:
    """Compile the stack for every shape serving uses, on a scratch cache (any thread may call this)."""
    if runner.net.compiled_stack is None:
        return 0.0
    start = time.perf_counter()
    shapes = compile_shapes(runner)
    slots = max(shape.rows + shape.chunks for shape in shapes)
    scratch = SlotKVCache(runner.cache.shape, slots=slots, capacity=64, device=runner.device)
    mark_cache_dynamic(scratch)
    # One decode row runs in one call of aieng's kernels where they fit (``one_row``): no graph.
    traced = [s for s in shapes if not (s.rows == 1 and not s.chunks and runner.net.one_row is not None)]
    for i, shape in enumerate(traced, 1):
        progress(f"compiling the decoder layer: {shape.describe()} ({i}/{len(traced)})")
        for size in (6, 7):  # two sizes, so the graph is built with symbolic lengths
            with compile_settings():
                scratch_step(runner, scratch, shape, size)
    if GraphShape(1, 0, False) in shapes and GraphShape(1, 0, True) in shapes and runner.timed_one_row_bf16 is None:
        runner.timed_one_row_bf16 = _faster_one_row_format(runner, scratch)
    if runner.net.one_row is None:  # else the row's output projection runs eagerly: cheaper than a graph's guards
        build_head(runner.net, bf16=runner.one_row_bf16, quantized=bool(runner.quantized_rows), progress=progress)
    if not runner.one_row_bf16 and not runner.formats.uses_bf16:
        runner.net.drop_bf16_copy()  # no step uses the copy: give its memory back
    return time.perf_counter() - start


def build_head(net, *, bf16: bool, progress: Callable[[str], None], quantized: bool = False) -> None:
    """Compile the one-row output projection in the one-row step's format (``one_row_logits``)."""
    if net.compiled_head is None:
        return
    head, scales = net.lm_head_quantized if quantized and net.lm_head_quantized is not None else (net.head(bf16), None)
    kind = format_of(head) if scales is not None else "bf16" if bf16 else "fp32"
    progress(f"compiling the output projection: 1 row, {kind} weights")
    hidden = torch.zeros(1, net.final_norm.shape[0], dtype=net.dtype, device=net.lm_head.device)
    with compile_settings():
        net.compiled_head(hidden, net.final_norm, net.final_eps, head, net.dims.matvec_kernel, scales)
    net.head_ready = True


def scratch_step(runner, scratch: SlotKVCache, shape: GraphShape, size: int) -> None:
    """One compiled step of ``shape`` on the scratch cache: its decode rows at position
    ``size - 1``, its chunks (in the slots after them) ``size - 3`` tokens from position 0."""
    device, rows = runner.device, shape.rows
    pos = torch.full((rows,), size - 1, device=device) if rows else None
    plan = AttentionPlan(rows, 0, pos, causal_decode_mask(pos, size) if rows else None, None, None, None, None)
    prefill_tokens = rotary_pos = None
    if shape.chunks:
        width = size - 3
        chunk_pos = torch.arange(width, device=device).repeat(shape.chunks, 1)
        plan.prefill_slots = torch.arange(rows, rows + shape.chunks, device=device)
        # Separate tensors, as serving passes: dynamo guards on which arguments are the same object.
        plan.prefill_pos, plan.prefill_write, rotary_pos = chunk_pos, chunk_pos.clone(), chunk_pos.clone()
        plan.prefill_mask = (chunk_pos[:, None, :] <= chunk_pos[:, :, None])[:, None]
        prefill_tokens = torch.zeros(shape.chunks, width, dtype=torch.long, device=device)
    tokens = torch.zeros(rows, dtype=torch.long, device=device) if rows else None
    runner.net.hidden(
        plan,
        scratch,
        tokens,
        prefill_tokens,
        rotary_pos,
        bf16=shape.bf16,
        quantized=bool(shape.quantized),
        compiled=True,
    )


def _faster_one_row_format(runner, scratch: SlotKVCache, *, rounds: int = 5, steps: int = 5) -> bool:
    """Time the compiled one-row step in fp32 and bf16 the way ``measure_format_plan`` times
    the eager matrices (interleaved, medians, the same bar for bf16)."""

    def run(bf16: bool):
        return lambda: [scratch_step(runner, scratch, GraphShape(1, 0, bf16), 6) for _ in range(steps)]

    fp32_s, bf16_s = (s / steps for s in interleaved_medians(run(False), run(True), rounds=rounds))
    choice = bf16_wins(fp32_s, bf16_s)
    log.info(
        "compiled one-row step: %s weights (%.2f ms fp32, %.2f ms bf16)",
        "bf16" if choice else "fp32",
        fp32_s * 1e3,
        bf16_s * 1e3,
        extra={
            "event": "engine_weight_formats",
            "one_row": "bf16" if choice else "fp32",
            "fp32_ms": round(fp32_s * 1e3, 3),
            "bf16_ms": round(bf16_s * 1e3, 3),
        },
    )
    return choice


def compile_in_background(runner, progress: Callable[[str], None], done: Callable[[float], None]) -> threading.Thread:
    """Build the graphs on another thread; the engine serves eagerly until they are ready."""

    def work():
        try:
            seconds = build_graphs(runner, progress)
            runner.compiled_ready = True
            done(seconds)
        except Exception as exc:  # noqa: BLE001 - a compiler failure must never stop serving
            runner.compile_failed = True
            log.warning(
                "compiling the decoder layer failed (%s: %s); serving eagerly",
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
                extra={"event": "engine_compile_fallback"},
            )
            done(-1.0)

    runner.compile_thread = threading.Thread(target=work, name="aieng-compile", daemon=True)
    runner.compile_thread.start()
    return runner.compile_thread


def warm_up(
    runner,
    run_shapes: Callable[[list[tuple[int, int]], str], None],
    shapes: list[tuple[int, int]],
    progress: Callable[[str], None],
    budget_s: float | None,
    compile: bool,
) -> None:
    """Run ``shapes`` eagerly, then build the graphs (within ``budget_s`` when set). A successor
    runs one short shape on a scratch cache of its own: its graphs are shared and its process has
    run every kernel already, so its warm-up takes little from the engine serving beside it."""
    from aieng.engine.native.succession import scratch_cache

    start = time.perf_counter()
    if runner.successor:
        with scratch_cache(runner, capacity=min(64, runner.cache.capacity)):
            run_shapes([(1, min(length for _, length in shapes))], "eager")
        return
    runner.compiled_ready = False  # the shapes run eagerly; graphs are built after them
    run_shapes(shapes, "eager")
    if not compile or runner.net.compiled_stack is None:
        return
    if budget_s is None:
        seconds = build_graphs(runner, progress)
        runner.compiled_ready = True
        log.info(
            "compiled the decoder layer in %.1f s",
            seconds,
            extra={"event": "engine_compiled", "seconds": round(seconds, 2)},
        )
        return

    def done(seconds: float) -> None:
        if seconds >= 0:
            log.info(
                "compiled the decoder layer in %.1f s; decode steps use the graphs from now on",
                seconds,
                extra={"event": "engine_compiled", "seconds": round(seconds, 2)},
            )

    thread = compile_in_background(runner, progress, done)
    thread.join(max(0.0, budget_s - (time.perf_counter() - start)))
    if thread.is_alive():
        log.warning(
            "compilation is past its budget (%.0f s): serving eagerly meanwhile; decode steps switch to "
            "the compiled graphs when they are ready",
            budget_s,
            extra={"event": "engine_compile_background"},
        )
