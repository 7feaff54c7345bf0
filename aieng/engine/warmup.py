"""Engine warm-up: run the shapes serving will run, and let the runner build its compiled code.

Why a warm-up at all: the first call of every shape pays lazy set-up (kernel selection, memory
pools, and with compilation on, building graphs), which would otherwise land on the first users.
Every shape is announced through ``progress`` before it runs, so a start-up never goes silent.

The shapes are the engine's (batch sizes by prompt lengths, ``EngineConfig``); what else a warm-up
does is the runner's (``Runner.warm_up``): the native forward runs them eagerly and then compiles
one decoder layer per step shape, within ``compile_budget_s`` (``native.graphs``); a hot swap's
successor runs one short shape; transformers' forward compiles the whole forward while running them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from aieng.engine.params import SamplingParams


def warm_up(engine, progress: Callable[[str], None]) -> float:
    start = time.perf_counter()
    config = engine.config
    vocab = int(engine.model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=2, temperature=0)
    batch_sizes = sorted({min(b, engine.max_rows) for b in config.warmup_batch_sizes})
    shapes = [(b, n) for b in batch_sizes for n in config.warmup_prompt_lengths]

    def run_shapes(chosen: list[tuple[int, int]], mode: str) -> None:
        for i, (batch_size, length) in enumerate(chosen, 1):
            length = min(length, engine.context_length - 2)
            progress(f"prefill and decode, batch {batch_size} × {length} tokens, {mode} ({i}/{len(chosen)})")
            prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(batch_size)]
            engine.generate(prompts, params)

    engine.runner.warm_up(run_shapes, shapes, progress, budget_s=config.compile_budget_s, compile=config.compile)
    return time.perf_counter() - start
