"""Where decode time goes: milliseconds per step against position and against batch size.

The engine's own ``prefill``/``decode`` are timed directly (no HTTP, no scheduler), so the
curves show the model and the loop alone. Notebook 04 plots them.
"""

from __future__ import annotations

import statistics
import time

from aieng.engine import Engine, GenerationRequest
from aieng.engine.params import SamplingParams


def ms_per_step_by_position(engine: Engine, prompt_ids: list[int], *, new_tokens: int = 256) -> list[tuple[int, float]]:
    """(position, ms) for each decode step of one row generating ``new_tokens`` tokens."""
    new_tokens = min(new_tokens, engine.context_length - len(prompt_ids) - 1)
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    engine.prefill([GenerationRequest("pos", prompt_ids, params)])
    points = []
    position = len(prompt_ids) + 1
    while engine.num_running:
        start = time.perf_counter()
        engine.decode()
        points.append((position, (time.perf_counter() - start) * 1000))
        position += 1
    return points


def ms_per_step_by_batch(
    engine: Engine, prompt_ids: list[int], batch_sizes: list[int], *, steps: int = 16
) -> list[dict]:
    """Median ms per decode step and per generated token, for each batch size."""
    rows = []
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for size in batch_sizes:
        engine.prefill([GenerationRequest(f"b{size}-{i}", prompt_ids, params) for i in range(size)])
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.decode()
            times.append(time.perf_counter() - start)
        engine.remove(engine.running_ids())
        step_ms = statistics.median(times) * 1000
        rows.append(
            {
                "batch_size": size,
                "ms_per_step": step_ms,
                "ms_per_token": step_ms / size,
                "tokens_per_s": size / (step_ms / 1000),
            }
        )
    return rows
