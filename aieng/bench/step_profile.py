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
    engine: Engine, prompt_ids: list[int], batch_sizes: list[int], *, steps: int = 16, rounds: int = 3
) -> list[dict]:
    """Median ms per decode step and per generated token, for each batch size.

    The sizes are measured in ``rounds`` interleaved passes of ``steps // rounds`` steps each (at
    least one), not one size after another: a neighbour that is busy for a few seconds then slows
    every size a little instead of one size a lot, so the ratios between sizes hold on a shared
    machine."""
    rounds = max(1, min(rounds, steps))
    per_round = max(1, steps // rounds)
    params = SamplingParams(max_tokens=per_round + 2, temperature=0, ignore_eos=True)
    times: dict[int, list[float]] = {size: [] for size in batch_sizes}
    for round_ in range(rounds):
        for size in batch_sizes:
            engine.prefill([GenerationRequest(f"b{size}-{round_}-{i}", prompt_ids, params) for i in range(size)])
            for _ in range(per_round):
                start = time.perf_counter()
                engine.decode()
                times[size].append(time.perf_counter() - start)
            engine.remove(engine.running_ids())
    rows = []
    for size in batch_sizes:
        step_ms = statistics.median(times[size]) * 1000
        rows.append(
            {
                "batch_size": size,
                "ms_per_step": step_ms,
                "ms_per_token": step_ms / size,
                "tokens_per_s": size / (step_ms / 1000),
            }
        )
    return rows


#: ``StepSplit`` fields by the names a report uses.
SPLIT_PARTS = {"layers": "layers_s", "output_projection": "head_s", "sampling": "sampling_s", "other": "other_s"}


def batch1_split(engine: Engine, prompt_ids: list[int], *, steps: int = 32) -> dict[str, float | None]:
    """Median milliseconds of each part of a batch-1 decode step (``Engine.last_split``: layers,
    output projection, sampling, other) and of the whole step, over ``steps`` steps of one row.
    ``output_projection`` is None where the runner does not time it apart (it is then in ``layers``)."""
    params = SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True)
    engine.prefill([GenerationRequest("split", prompt_ids, params)])
    splits = []
    while engine.num_running:
        engine.decode()
        splits.append(engine.last_split)
    ms = {"step": statistics.median(s.total_s for s in splits) * 1000}
    for name, field in SPLIT_PARTS.items():
        values = [getattr(s, field) for s in splits]
        ms[name] = None if None in values else statistics.median(values) * 1000
    return ms
