"""Engine warm-up: run the shapes serving will run, then build the compiled graphs.

Why a warm-up at all: the first call of every shape pays lazy set-up (kernel selection, memory
pools, and with compilation on, building graphs), which would otherwise land on the first users.
Every shape is announced through ``progress`` before it runs, so a start-up never goes silent.

Native forward: the shapes run eagerly (fast), then one decoder layer is compiled per decode
shape (``NativeRunner.build_graphs``: a handful of small graphs, however deep the model). With
``EngineConfig.compile_budget_s`` set, warm-up waits at most that long for them: past it the
engine serves eagerly and decode steps switch to the graphs when the background thread is done.

A successor (``Engine(..., replacing=...)``, a hot swap to weights of the same layout) runs one
small shape: its process has run every kernel already, and the shared graphs need no building, so
the swap's warm-up takes little from the engine serving beside it.

Transformers forward: the shapes run through the compiled whole-model forward (that *is* the
compilation), then guard evaluation is switched off for the warmed graphs (``CompiledForward``).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from collections.abc import Callable

import torch

from aieng.engine.params import SamplingParams
from aieng.engine.succession import scratch_cache

log = logging.getLogger("aieng.engine")


def warm_up(engine, progress: Callable[[str], None]) -> float:
    start = time.perf_counter()
    config = engine.config
    vocab = int(getattr(engine.model.config, "vocab_size", 256))
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=2, temperature=0)
    batch_sizes = sorted({min(b, engine.max_rows) for b in config.warmup_batch_sizes})
    shapes = [(b, n) for b in batch_sizes for n in config.warmup_prompt_lengths]
    native = hasattr(engine.runner, "build_graphs")
    successor = native and engine.runner.successor
    if successor:  # a hot swap: one short request checks the new weights run (its graphs are shared)
        shapes = [(1, min(config.warmup_prompt_lengths))]
    elif native:
        engine.runner.compiled_ready = False  # the shapes run eagerly; graphs are built after them
    mode = "eager" if native or not engine.compiled else "compiling the forward"
    with scratch_cache(engine.runner, capacity=min(64, engine.context_length)) if successor else nullcontext():
        _run_shapes(engine, shapes, params, vocab, generator, progress, mode)
    if not native:
        if engine.compiled:
            engine.runner.forward_fn.mark_warm()
        return time.perf_counter() - start
    if config.compile and engine.runner.net.compiled_stack is not None:
        _compile(engine, progress, start)
    return time.perf_counter() - start


def _run_shapes(engine, shapes, params, vocab: int, generator, progress, mode: str) -> None:
    for i, (batch_size, length) in enumerate(shapes, 1):
        length = min(length, engine.context_length - 2)
        progress(f"prefill and decode, batch {batch_size} × {length} tokens, {mode} ({i}/{len(shapes)})")
        prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(batch_size)]
        engine.generate(prompts, params)


def _compile(engine, progress: Callable[[str], None], start: float) -> None:
    runner, budget = engine.runner, engine.config.compile_budget_s
    if budget is None:
        seconds = runner.build_graphs(progress)
        runner.compiled_ready = True
        log.info("compiled the decoder layer in %.1f s", seconds, extra={"event": "engine_compiled",
                                                                        "seconds": round(seconds, 2)})
        return

    def done(seconds: float) -> None:
        if seconds >= 0:
            log.info("compiled the decoder layer in %.1f s; decode steps use the graphs from now on", seconds,
                     extra={"event": "engine_compiled", "seconds": round(seconds, 2)})

    thread = runner.compile_in_background(progress, done)
    thread.join(max(0.0, budget - (time.perf_counter() - start)))
    if thread.is_alive():
        log.warning("compilation is past its budget (%.0f s): serving eagerly meanwhile; decode steps switch to "
                    "the compiled graphs when they are ready", budget, extra={"event": "engine_compile_background"})
