"""Engine warm-up: run the shapes serving will run, and let the runner build its compiled code.

Why a warm-up at all: the first call of every shape pays lazy set-up (kernel selection, memory
pools, and with compilation on, building graphs), which would otherwise land on the first users.
Every shape is announced through ``progress`` before it runs, so a start-up never goes silent.

The shapes are the engine's (batch sizes by prompt lengths, ``EngineConfig``), run smallest first;
once one of them after the first (whose time is mostly the set-up warm-up is for) takes
``warmup_eager_shape_limit_s`` eagerly, the larger ones are skipped: on a
model of a billion parameters the largest batch of prompts is seconds of arithmetic that
readiness would wait for, while the set-up it would save the first such request is a small part
of that request's own time. What else a warm-up
does is the runner's (``Runner.warm_up``): the native forward runs them eagerly and then compiles
one decoder layer per step shape, within ``compile_budget_s`` (``native.graphs``); a hot swap's
successor runs one short shape; transformers' forward compiles the whole forward while running them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from aieng.engine.params import SamplingParams

log = logging.getLogger("aieng.engine")


def warm_up(engine, progress: Callable[[str], None]) -> float:
    start = time.perf_counter()
    config = engine.config
    vocab = int(engine.model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=2, temperature=0)
    batch_sizes = sorted({min(b, engine.max_rows) for b in config.warmup_batch_sizes})
    lengths = sorted({min(n, engine.context_length - 2) for n in config.warmup_prompt_lengths})
    shapes = sorted(((b, n) for b in batch_sizes for n in lengths), key=lambda shape: (shape[0] * shape[1], shape))

    def run_shapes(chosen: list[tuple[int, int]], mode: str) -> None:
        for i, (batch_size, length) in enumerate(chosen, 1):
            progress(f"prefill and decode, batch {batch_size} × {length} tokens, {mode} ({i}/{len(chosen)})")
            prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(batch_size)]
            shape_start = time.perf_counter()
            engine.generate(prompts, params)
            took = time.perf_counter() - shape_start
            if mode == "eager" and 1 < i < len(chosen) and took >= config.warmup_eager_shape_limit_s:
                _skip(chosen[i:], (batch_size, length), took, progress)
                return

    engine.runner.warm_up(run_shapes, shapes, progress, budget_s=config.compile_budget_s, compile=config.compile)
    return time.perf_counter() - start


def _skip(rest: list[tuple[int, int]], last: tuple[int, int], took: float, progress: Callable[[str], None]) -> None:
    skipped = ", ".join(f"{b} × {n}" for b, n in rest)
    progress(f"skipping the larger shapes ({skipped}): batch {last[0]} × {last[1]} took {took:.1f} s")
    log.info(
        "warm-up skips its larger shapes: batch %d × %d tokens took %.1f s eagerly",
        last[0],
        last[1],
        took,
        extra={"event": "engine_warmup_skipped", "shapes": [list(s) for s in rest], "seconds": round(took, 2)},
    )
