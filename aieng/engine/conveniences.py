"""``Engine.generate`` and ``Engine.stream``: requests run to completion on the engine's own steps.

For notebooks, tests and benchmarks that drive an engine in-process; the server drives ``step``
from its scheduler instead. Both validate their requests themselves (``Engine._request``): they are
their own front door.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from aieng.engine.params import GenerationResult, SamplingParams
from aieng.engine.request import TokenEvent


def generate(
    engine,
    prompts: Sequence[str | list[int]],
    params: SamplingParams | Sequence[SamplingParams],
    *,
    max_batch_size: int = 64,
) -> list[GenerationResult]:
    """Run prompts to completion, at most ``max_batch_size`` rows at a time; results in prompt order."""
    params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    if any(p.n != 1 for p in params_list):
        raise ValueError("generate() returns one result per prompt: n must be 1 (step() serves n > 1)")
    pending = [engine._request(f"gen-{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params_list))]
    order = [r.request_id for r in pending]
    texts: dict[str, list[str]] = {rid: [] for rid in order}
    results: dict[str, GenerationResult] = {}
    while pending or engine.rows:
        room = min(max_batch_size, engine.max_rows) - len(engine.rows)
        joiners, pending = pending[:room], pending[room:]
        for event in engine.step(joiners).events:
            texts[event.request_id].append(event.text)
            if event.finished:
                if event.error is not None:
                    raise event.error
                results[event.request_id] = GenerationResult(
                    text="".join(texts[event.request_id]),
                    finish_reason=event.finish_reason,
                    prompt_tokens=event.prompt_tokens,
                    completion_tokens=event.completion_tokens,
                    token_ids=event.token_ids,
                )
    return [results[rid] for rid in order]


def stream(
    engine, prompt: str | list[int], params: SamplingParams, request_id: str = "stream-0"
) -> Iterator[TokenEvent]:
    """Yield the events of one request as they are produced (alone in the batch)."""
    joiners = [engine._request(request_id, prompt, params)]
    while True:
        events = engine.step(joiners).events
        joiners = []
        for event in events:
            if event.request_id == request_id:
                yield event
                if event.finished:
                    return
