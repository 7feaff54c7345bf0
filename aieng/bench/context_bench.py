"""Long context on the engine alone: what a decode step costs as the KV cache grows, and what a
long prompt joining does to the rows already streaming.

Two measurements, both on the engine's own steps (no HTTP), median over repeats:

1. **Step cost by KV length.** The median decode step of ``batch`` rows at KV length 64 against
   the same at 1,256 (a 1,000-token prompt after 256 new tokens), alternated over repeats.
   With the static cache a step writes one column
   and reads the rows' prefixes, so the ratio stays near 1 until attention, not the weights,
   dominates. Target (realistic-shape issue): ≤ 1.3 at 1,256 tokens.
2. **A long prompt joining running streams.** ``streams`` rows decode steadily; a
   ``join_tokens``-token prompt arrives. With chunked prefill it is prefilled in chunks inside the
   decode steps, so the running rows' worst inter-token gap stays near a step; without (one chunk),
   the whole prompt lands in one step. Target: their inter-token p99 ≤ 2 × the median step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

from aieng.engine import Engine, GenerationRequest, SamplingParams


@dataclass
class ContextBenchResult:
    batch: int
    short_kv: int
    long_kv: int
    short_step_ms: float
    long_step_ms: float
    step_ratio: float
    streams: int
    join_tokens: int
    median_step_ms: float
    itl_p99_ms: float
    itl_p99_over_median: float
    chunk_tokens: int

    def to_dict(self) -> dict:
        return asdict(self)


def step_ms_at_kv_length(engine: Engine, *, batch: int, kv_length: int, window: int = 8, progress=None) -> float:
    """Median decode-step ms of ``batch`` rows whose KV length is ``kv_length`` (± ``window``)."""
    prompt = [(7 * i) % 200 + 5 for i in range(kv_length - window)]
    params = SamplingParams(max_tokens=2 * window + 1, temperature=0, ignore_eos=True)
    engine.prefill([GenerationRequest(f"kv{kv_length}-{i}", prompt, params) for i in range(batch)])
    times = []
    while engine.num_running:
        start = time.perf_counter()
        engine.decode()
        times.append(time.perf_counter() - start)
        if progress:
            progress(1)
    return statistics.median(times[:-1]) * 1000


def itl_while_a_long_prompt_joins(
    engine: Engine,
    *,
    streams: int,
    join_tokens: int,
    before: int = 12,
    after: int = 8,
    max_steps: int = 1000,
    progress=None,
) -> tuple[float, float]:
    """(median step ms, p99 of the running rows' inter-token gaps in ms) from ``before`` steps
    ahead of a long prompt's arrival to ``after`` steps past its first token."""
    params = SamplingParams(max_tokens=engine.context_length - 16, temperature=0, ignore_eos=True)
    engine.prefill([GenerationRequest(f"s{i}", [5 + i, 9, 11, 13, 17, 19, 23, 29], params) for i in range(streams)])
    long_prompt = [(11 * i) % 300 + 3 for i in range(join_tokens)]
    last_seen: dict[str, float] = {}
    gaps, step_times = [], []
    joined_at = None
    for step in range(max_steps):
        joiners = (
            [GenerationRequest("long", long_prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))]
            if step == before
            else []
        )
        start = time.perf_counter()
        result = engine.step(joiners)
        now = time.perf_counter()
        step_times.append(now - start)
        for event in result.events:
            if event.request_id.startswith("s"):
                if event.request_id in last_seen:
                    gaps.append(now - last_seen[event.request_id])
                last_seen[event.request_id] = now
            elif event.request_id == "long" and joined_at is None:
                joined_at = step
        if progress:
            progress(1)
        if joined_at is not None and step >= joined_at + after:
            break
    engine.remove(engine.running_ids())
    if joined_at is None:
        raise RuntimeError(f"the long prompt produced no token in {max_steps} steps")
    gaps.sort()
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    return statistics.median(step_times) * 1000, p99 * 1000


def run_context_bench(
    engine: Engine,
    *,
    batch: int = 1,
    short_kv: int = 64,
    long_kv: int = 1256,
    repeats: int = 3,
    streams: int = 16,
    join_tokens: int = 1000,
    progress=None,
) -> ContextBenchResult:
    long_kv = min(long_kv, engine.context_length - 20)  # a short-context model (the demo: 512) is measured to its end
    join_tokens = min(join_tokens, engine.context_length - 60)
    shorts, longs = [], []
    for _ in range(repeats):  # alternated, so a noisy neighbour hits both
        shorts.append(step_ms_at_kv_length(engine, batch=batch, kv_length=short_kv, progress=progress))
        longs.append(step_ms_at_kv_length(engine, batch=batch, kv_length=long_kv, progress=progress))
    short_ms, long_ms = statistics.median(shorts), statistics.median(longs)
    median_ms, p99_ms = itl_while_a_long_prompt_joins(
        engine, streams=streams, join_tokens=join_tokens, progress=progress
    )
    return ContextBenchResult(
        batch=batch,
        short_kv=short_kv,
        long_kv=long_kv,
        short_step_ms=round(short_ms, 2),
        long_step_ms=round(long_ms, 2),
        step_ratio=round(long_ms / short_ms, 3),
        streams=streams,
        join_tokens=join_tokens,
        median_step_ms=round(median_ms, 2),
        itl_p99_ms=round(p99_ms, 2),
        itl_p99_over_median=round(p99_ms / median_ms, 3),
        chunk_tokens=engine.prefill_budget.max_tokens if engine.chunked else 0,
    )
