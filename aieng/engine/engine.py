"""The generation engine: prefill and decode over a running batch that rows join and leave
between steps (continuous batching), with per-row sampling, stops and streaming.

Contract with whoever drives it (the scheduler's engine thread, or ``generate``/``stream`` here):

- ``step(joiners, leaving)`` is one iteration: drop the ``leaving`` rows (cancelled, timed out),
  prefill the ``joiners`` and merge them into the batch, then decode one token for every row.
  It returns a ``StepResult``: the events and the prefill/decode timings.
- ``prefill``, ``decode`` and ``remove`` are the same three parts, public for tools that time
  them separately (``aieng.bench.step_profile``, notebook 04).

Requests arrive validated (``params.validate_request``). A finished row (EOS, stop string,
``max_tokens``, context limit) leaves the batch in the step that reports it. The engine is
single-threaded by design: one thread owns it and the model. It owns no scheduling policy:
which requests join, and how many rows run at once, is the scheduler's business.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from aieng.engine.compiled import CompiledForward
from aieng.engine.hf_model import cache_kwarg, pad_token_id, prepare_model, refuse_sliding_window
from aieng.engine.kv_batch import KVBatch, left_pad
from aieng.engine.oom import bisect_on_oom, out_of_memory_error
from aieng.engine.params import GenerationResult, SamplingParams, validate_request
from aieng.engine.request import GenerationRequest, StepResult, TokenEvent, error_event
from aieng.engine.row import Row
from aieng.engine.sampling import sample_batch
from aieng.model_facts import eos_token_ids, model_context_length

log = logging.getLogger("aieng.engine")


@dataclass(frozen=True)
class EngineConfig:
    compile: bool = True  # torch.compile prefill and decode (aieng.engine.compiled); `aieng bench engine` measures it
    quantize_int8: bool = False  # dynamic int8 Linear layers on CPU; `aieng bench engine --int8` measures it
    warmup_prompt_lengths: tuple[int, ...] = (8, 32, 128)
    warmup_batch_sizes: tuple[int, ...] = (1, 8)


class Engine:
    def __init__(self, model, tokenizer, *, context_length: int | None = None, config: EngineConfig = EngineConfig()):
        refuse_sliding_window(model.config)
        self.config = config
        self.tokenizer = tokenizer
        self.model = prepare_model(model, quantize_int8=config.quantize_int8)
        self.device = next(model.parameters()).device
        self.context_length = context_length or model_context_length(model)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = pad_token_id(tokenizer, self.eos_ids)
        self.forward = CompiledForward(self.model, enabled=config.compile)
        self._cache_kwarg = cache_kwarg(self.model)
        self.batch: KVBatch | None = None  # the running rows' KV cache, row i of it is rows[i]
        self.rows: list[Row] = []
        self.counts = {"prefill_calls": 0, "decode_steps": 0, "oom_splits": 0}

    @property
    def compiled(self) -> bool:
        return self.forward.active

    @property
    def stats(self) -> dict[str, int]:
        return {**self.counts, "rewarms": self.forward.rewarms, "compile_fallbacks": self.forward.fallbacks}

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)["input_ids"]

    @property
    def num_running(self) -> int:
        return len(self.rows)

    def running_ids(self) -> list[str]:
        return [row.request_id for row in self.rows]

    # -- one iteration of continuous batching ---------------------------------------------------
    def step(self, joiners: Sequence[GenerationRequest] = (), leaving: Sequence[str] = ()) -> StepResult:
        """Drop ``leaving``, prefill ``joiners``, then decode everybody."""
        self.remove(leaving)
        start = time.perf_counter()
        events = self.prefill(joiners)
        middle = time.perf_counter()
        rows = self.num_running
        events += self.decode()
        return StepResult(events, prefill_s=middle - start if joiners else None,
                          decode_s=time.perf_counter() - middle if rows else None, decoded_rows=rows)

    # The batch's tensors are all created under inference_mode (the cache is an input of the
    # compiled decode graph, and a tensor's inference-ness is part of what that graph was built for).
    @torch.inference_mode()
    def prefill(self, requests: Sequence[GenerationRequest]) -> list[TokenEvent]:
        """Run the prompts of ``requests`` together, sample their first tokens, join the batch.

        Out of memory: the group is bisected (``oom.bisect_on_oom``); a request that does not fit
        alone gets an ``out_of_memory`` error event and the engine carries on.
        """
        if not requests:
            return []
        return bisect_on_oom(list(requests), self._prefill_group, combine=operator.add,
                             fail_one=lambda request, exc: [self._fail(request, exc)], device=self.device,
                             phase="prefill", on_split=self._count_split)

    @torch.inference_mode()
    def decode(self) -> list[TokenEvent]:
        """One decode step for every running row (bisected on out of memory, like prefill)."""
        if not self.rows:
            return []
        batch, rows = self.batch, self.rows

        def attempt(indices: Sequence[int]):
            part = batch if len(indices) == len(rows) else batch.select(list(indices))
            return self._decode_rows(part, [rows[i] for i in indices])

        def fail_one(index: int, exc: BaseException):
            return None, [], [self._fail(rows[index].request, exc)]

        self.batch, self.rows, events = bisect_on_oom(range(len(rows)), attempt, combine=_combine_decoded,
                                                      fail_one=fail_one, device=self.device, phase="decode",
                                                      on_split=self._count_split)
        self.counts["decode_steps"] += 1
        return events

    @torch.inference_mode()
    def remove(self, request_ids: Sequence[str]) -> list[str]:
        """Drop rows (cancelled, timed out); returns the ids that were running."""
        doomed = set(request_ids)
        removed = [row.request_id for row in self.rows if row.request_id in doomed]
        if removed:
            keep = [i for i, row in enumerate(self.rows) if row.request_id not in doomed]
            self.rows = [self.rows[i] for i in keep]
            self.batch = self.batch.select(keep) if keep else None
        return removed

    # -- conveniences built on the steps -------------------------------------------------------
    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams | Sequence[SamplingParams], *,
                 max_batch_size: int = 64) -> list[GenerationResult]:
        """Run prompts to completion, at most ``max_batch_size`` rows at a time; results in prompt order."""
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        pending = [self._request(f"gen-{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params_list))]
        order = [r.request_id for r in pending]
        texts: dict[str, list[str]] = {rid: [] for rid in order}
        results: dict[str, GenerationResult] = {}
        while pending or self.rows:
            room = max_batch_size - len(self.rows)
            joiners, pending = pending[:room], pending[room:]
            for event in self.step(joiners).events:
                texts[event.request_id].append(event.text)
                if event.finished:
                    if event.error is not None:
                        raise event.error
                    results[event.request_id] = GenerationResult(
                        text="".join(texts[event.request_id]), finish_reason=event.finish_reason,
                        prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                        token_ids=event.token_ids)
        return [results[rid] for rid in order]

    def stream(self, prompt: str | list[int], params: SamplingParams, request_id: str = "stream-0") -> Iterator[TokenEvent]:
        """Yield the events of one request as they are produced (alone in the batch)."""
        joiners = [self._request(request_id, prompt, params)]
        while True:
            events = self.step(joiners).events
            joiners = []
            for event in events:
                if event.request_id == request_id:
                    yield event
                    if event.finished:
                        return

    def warmup(self) -> float:
        """Prefill and decode representative shapes so the first real request pays no lazy set-up
        (with compile on: builds every graph serving uses, then lets calls skip guard checks)."""
        start = time.perf_counter()
        vocab = int(getattr(self.model.config, "vocab_size", 256))
        generator = torch.Generator().manual_seed(0)
        params = SamplingParams(max_tokens=2, temperature=0)
        for batch_size in self.config.warmup_batch_sizes:
            for length in self.config.warmup_prompt_lengths:
                length = min(length, self.context_length - 2)
                prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(batch_size)]
                self.generate(prompts, params)
        self.forward.mark_warm()
        return time.perf_counter() - start

    # -- internals -----------------------------------------------------------------------------
    def _request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> GenerationRequest:
        """A request for the conveniences above, validated here: they are their own front door."""
        ids = prompt if isinstance(prompt, list) else self.encode(prompt)
        validate_request(len(ids), params, self.context_length)
        return GenerationRequest(request_id, ids, params)

    def _prefill_group(self, requests: Sequence[GenerationRequest]) -> list[TokenEvent]:
        from transformers import DynamicCache

        # Compiled: a 1-token prompt gets one pad column (length 1 would be a graph of its own).
        input_ids, mask = left_pad([r.prompt_ids for r in requests], self.pad_id, min_length=2 if self.compiled else 1)
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)  # [n, L]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, L]

        def inputs() -> dict:  # a fresh cache on every try: a failed call may have half-filled one
            # Compiled: always a mask, so padded and unpadded groups share a graph.
            pass_mask = self.compiled or bool((mask == 0).any())
            return dict(input_ids=input_ids, attention_mask=mask if pass_mask else None, position_ids=positions,
                        use_cache=True, logits_to_keep=1, **{self._cache_kwarg: DynamicCache()})

        out, used = self._call_model(inputs)
        self.counts["prefill_calls"] += 1
        new_batch = KVBatch(used[self._cache_kwarg], mask, mask.sum(-1)).make_contiguous()  # filled in place
        new_rows = [Row.start(r, self.tokenizer, self.device) for r in requests]
        events, alive = self._sample(out.logits[:, -1, :], new_rows)
        if alive:
            self.batch = KVBatch.merge(self.batch, new_batch if len(alive) == len(new_rows) else new_batch.select(alive))
            self.rows = self.rows + [new_rows[i] for i in alive]
        return events

    def _decode_rows(self, batch: KVBatch, rows: list[Row]) -> tuple[KVBatch | None, list[Row], list[TokenEvent]]:
        snapshot = [(layer.keys, layer.values) for layer in batch.cache.layers]

        def undo() -> None:  # a failed call may have appended to some layers: put them back
            for layer, (keys, values) in zip(batch.cache.layers, snapshot):
                layer.keys, layer.values = keys, values

        def inputs() -> dict:
            input_ids = torch.tensor([[row.last_token] for row in rows], dtype=torch.long, device=self.device)  # [B, 1]
            mask = None
            # Compiled: every step carries a mask, so one graph serves padded and unpadded batches
            # (and a lone padded row, such as a 1-token prompt padded to 2, needs no graph of its own).
            if batch.padded or self.compiled:
                ones = torch.ones((batch.size, 1), dtype=batch.mask.dtype, device=batch.mask.device)
                mask = torch.cat([batch.mask, ones], dim=1)  # [B, T+1]
            return dict(input_ids=input_ids, attention_mask=mask, position_ids=batch.next_pos[:, None],
                        use_cache=True, **{self._cache_kwarg: batch.cache})

        out, _ = self._call_model(inputs, undo=undo)
        batch.append_column()
        events, alive = self._sample(out.logits[:, -1, :], rows)
        if len(alive) < len(rows):
            batch = batch.select(alive) if alive else None
            rows = [rows[i] for i in alive]
        return batch, rows, events

    def _call_model(self, make_inputs, *, undo=lambda: None):
        """The forward; a compiler failure the compile state recovers from is retried (after ``undo``)."""
        while True:
            inputs = make_inputs()
            try:
                return self.forward(**inputs), inputs
            except Exception as exc:
                undo()
                if not self.forward.recover(exc):
                    raise

    def _sample(self, logits: torch.Tensor, rows: list[Row]) -> tuple[list[TokenEvent], list[int]]:
        """One token per row, turned into events; also the indices of the rows still running."""
        tokens = sample_batch(logits, [r.request.params for r in rows], [r.generator for r in rows],
                              [r.seen for r in rows])
        events = [row.advance(token, eos_ids=self.eos_ids, context_length=self.context_length)
                  for row, token in zip(rows, tokens)]
        return events, [i for i, event in enumerate(events) if not event.finished]

    def _count_split(self) -> None:
        self.counts["oom_splits"] += 1

    def _fail(self, request: GenerationRequest, exc: BaseException) -> TokenEvent:
        log.error("out of memory even alone in the batch: %s", exc,
                  extra={"event": "engine_oom", "trace_id": request.trace_id, "prompt_tokens": len(request.prompt_ids)})
        return error_event(request.request_id, out_of_memory_error(), prompt_tokens=len(request.prompt_ids))


def _combine_decoded(first, second):
    """Two halves of a bisected decode step back into one batch (either half may have emptied)."""
    (b1, r1, e1), (b2, r2, e2) = first, second
    batch = b2 if b1 is None else (b1 if b2 is None else KVBatch.merge(b1, b2))
    return batch, r1 + r2, e1 + e2
