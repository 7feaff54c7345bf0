"""The hand-written generation engine: prefill and decode over a running batch that rows join
and leave between steps (continuous batching), with per-row sampling, stops and streaming.

Contract with whoever drives it (the scheduler's engine thread, or ``generate``/``stream`` here):

- ``check(request)`` validates a request up front (cheap; call it before queueing);
- ``prefill(requests)`` runs the prompts of new rows, samples their first token and merges them
  into the running batch;
- ``decode()`` runs one step for every running row;
- ``remove(request_ids)`` drops rows (client gone, deadline passed) before the next step.

Each call returns ``TokenEvent``s; a finished row (EOS, stop string, ``max_tokens``, context
limit) leaves the batch in the same call that reports it. The engine is single-threaded by
design: one thread owns it and the model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from aieng.engine.detokenize import IncrementalDetokenizer
from aieng.engine.kv_batch import KVBatch
from aieng.engine.oom import is_out_of_memory, release_cached_memory
from aieng.engine.params import GenerationResult, SamplingParams, validate_request
from aieng.engine.sampling import new_generator, sample_batch
from aieng.engine.stops import StopMatcher
from aieng.errors import AiengError, InvalidRequestError


log = logging.getLogger("aieng.engine")


class OutOfMemoryRowError(AiengError):
    code = "out_of_memory"
    status = 503
    type = "server_error"


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 64  # rows decoded together at most
    compile: bool = False  # torch.compile the forward pass (measured in notebook 03; off by default)
    quantize_int8: bool = False  # dynamic int8 Linear layers on CPU (measured; off by default)
    warmup_prompt_lengths: tuple[int, ...] = (8, 32, 128)
    warmup_batch_sizes: tuple[int, ...] = (1, 8)


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    trace_id: str | None = None  # carried into engine-thread log lines


@dataclass
class TokenEvent:
    request_id: str
    token_id: int | None
    text: str  # the new text (may be empty while a character or a possible stop string is incomplete)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "error"
    finish_cause: str | None = None  # "eos" | "stop_string" | "max_tokens" | "context_limit" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: AiengError | None = None
    token_ids: tuple[int, ...] = ()  # all generated ids, on the finishing event only


@dataclass
class _Row:
    request: GenerationRequest
    generator: torch.Generator
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    seen: torch.Tensor | None  # prompt + generated ids, only when repetition_penalty != 1
    generated: list[int] = field(default_factory=list)
    last_token: int = -1

    @property
    def request_id(self) -> str:
        return self.request.request_id


class Engine:
    def __init__(self, model, tokenizer, *, context_length: int | None = None, config: EngineConfig = EngineConfig()):
        self.config = config
        self.tokenizer = tokenizer
        self.model = _prepare_model(model, config)
        self.device = next(model.parameters()).device
        self.context_length = context_length or int(getattr(model.config, "max_position_embeddings", 2048))
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids), 0)
        self.pad_id = int(pad)
        self._forward = torch.compile(self.model.forward, dynamic=True) if config.compile else self.model.forward
        self._cache_kwarg = _cache_kwarg(self.model)
        _refuse_sliding_window(model.config)
        self.batch: KVBatch | None = None
        self.rows: list[_Row] = []
        self.stats = {"prefill_calls": 0, "decode_steps": 0, "oom_splits": 0}
        self.last_timings: tuple[float | None, float | None, int] = (None, None, 0)

    # -- requests ------------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)["input_ids"]

    def check(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError for bad parameters or a prompt that cannot fit the context."""
        request.params.validate()
        validate_request(len(request.prompt_ids), request.params, self.context_length)

    @property
    def num_running(self) -> int:
        return len(self.rows)

    def running_ids(self) -> list[str]:
        return [row.request_id for row in self.rows]

    # -- the two steps -------------------------------------------------------------------------
    def prefill(self, requests: Sequence[GenerationRequest]) -> list[TokenEvent]:
        """Run the prompts of ``requests`` together, sample their first tokens, join the batch.

        On out-of-memory the group is split in halves and retried; a single request that still
        does not fit gets an ``out_of_memory`` error event and the engine carries on.
        """
        if not requests:
            return []
        for request in requests:
            self.check(request)
        try:
            return self._prefill_group(list(requests))
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            release_cached_memory(self.device)
            self.stats["oom_splits"] += 1
            log.warning("out of memory in a prefill of %d rows; splitting", len(requests),
                        extra={"event": "engine_oom_split", "phase": "prefill", "rows": len(requests)})
            if len(requests) == 1:
                return [self._error_event(requests[0], exc)]
            half = len(requests) // 2
            return self.prefill(requests[:half]) + self.prefill(requests[half:])

    def decode(self) -> list[TokenEvent]:
        """One decode step for every running row."""
        if not self.rows:
            return []
        self.batch, self.rows, events = self._decode_rows(self.batch, self.rows)
        self.stats["decode_steps"] += 1
        return events

    def step(self, joiners: Sequence[GenerationRequest] = ()) -> list[TokenEvent]:
        """Prefill ``joiners`` then decode everybody: one iteration of continuous batching.

        ``last_timings`` keeps (prefill seconds, decode seconds, rows decoded) for the metrics.
        """
        start = time.perf_counter()
        events = self.prefill(joiners)
        middle = time.perf_counter()
        rows = self.num_running
        events += self.decode()
        self.last_timings = (middle - start if joiners else None, time.perf_counter() - middle if rows else None, rows)
        return events

    def remove(self, request_ids: Sequence[str]) -> list[str]:
        """Drop rows (cancelled, timed out); returns the ids that were running."""
        doomed = set(request_ids)
        keep = [i for i, row in enumerate(self.rows) if row.request_id not in doomed]
        removed = [row.request_id for row in self.rows if row.request_id in doomed]
        if removed:
            self._keep(keep)
        return removed

    # -- conveniences built on the steps -------------------------------------------------------
    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams | Sequence[SamplingParams]
                 ) -> list[GenerationResult]:
        """Run prompts to completion (in batches of ``max_batch_size``); results in prompt order."""
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        requests = [GenerationRequest(f"gen-{i}", p if isinstance(p, list) else self.encode(p), sp)
                    for i, (p, sp) in enumerate(zip(prompts, params_list))]
        results: dict[str, GenerationResult] = {}
        texts: dict[str, list[str]] = {r.request_id: [] for r in requests}
        pending = list(requests)
        while pending or self.rows:
            room = self.config.max_batch_size - len(self.rows)
            joiners, pending = pending[:room], pending[room:]
            for event in self.step(joiners):
                texts[event.request_id].append(event.text)
                if event.finished:
                    if event.error is not None:
                        raise event.error
                    results[event.request_id] = GenerationResult(
                        text="".join(texts[event.request_id]), finish_reason=event.finish_reason,
                        prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                        token_ids=event.token_ids)
        return [results[r.request_id] for r in requests]

    def stream(self, prompt: str | list[int], params: SamplingParams, request_id: str = "stream-0") -> Iterator[TokenEvent]:
        """Yield the events of one request as they are produced (alone in the batch)."""
        ids = prompt if isinstance(prompt, list) else self.encode(prompt)
        pending = [GenerationRequest(request_id, ids, params)]
        while True:
            events = self.step(pending)
            pending = []
            for event in events:
                if event.request_id == request_id:
                    yield event
                    if event.finished:
                        return

    def warmup(self) -> float:
        """Prefill and decode representative shapes so the first real request pays no lazy set-up."""
        start = time.perf_counter()
        vocab = int(getattr(self.model.config, "vocab_size", 256))
        generator = torch.Generator().manual_seed(0)
        params = SamplingParams(max_tokens=2, temperature=0)
        for batch_size in self.config.warmup_batch_sizes:
            for length in self.config.warmup_prompt_lengths:
                length = min(length, self.context_length - 2)
                prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(batch_size)]
                self.generate(prompts, params)
        return time.perf_counter() - start

    # -- internals -----------------------------------------------------------------------------
    def _new_row(self, request: GenerationRequest) -> _Row:
        params = request.params
        seen = (torch.tensor(request.prompt_ids, dtype=torch.long, device=self.device)
                if params.repetition_penalty != 1.0 else None)
        return _Row(request=request, generator=new_generator(params.seed, self.device),
                    detokenizer=IncrementalDetokenizer(self.tokenizer), stops=StopMatcher(params.stop), seen=seen)

    def _prefill_group(self, requests: list[GenerationRequest]) -> list[TokenEvent]:
        longest = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), longest), dtype=torch.long)
        for i, request in enumerate(requests):  # left padding: prompts end in the last column
            n = len(request.prompt_ids)
            input_ids[i, longest - n:] = torch.tensor(request.prompt_ids, dtype=torch.long)
            mask[i, longest - n:] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, L]
        from transformers import DynamicCache

        cache = DynamicCache()
        with torch.inference_mode():
            out = self._forward(input_ids=input_ids, attention_mask=mask if bool((mask == 0).any()) else None,
                                position_ids=positions, use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        self.stats["prefill_calls"] += 1
        new_batch = KVBatch(cache, mask, mask.sum(-1))  # the model filled `cache` in place
        new_rows = [self._new_row(r) for r in requests]
        events, alive = self._consume(out.logits[:, -1, :], new_rows)
        if len(alive) < len(new_rows):
            new_batch = new_batch.select(alive)
        if alive:
            self.batch = KVBatch.merge(self.batch, new_batch)
            self.rows = self.rows + [new_rows[i] for i in alive]
        return events

    def _decode_rows(self, batch: KVBatch, rows: list[_Row]) -> tuple[KVBatch | None, list[_Row], list[TokenEvent]]:
        snapshot = [(layer.keys, layer.values) for layer in batch.cache.layers]
        try:
            input_ids = torch.tensor([[row.last_token] for row in rows], dtype=torch.long, device=self.device)  # [B, 1]
            mask = None
            if batch.padded:
                mask = torch.cat([batch.mask, torch.ones((batch.size, 1), dtype=batch.mask.dtype,
                                                         device=batch.mask.device)], dim=1)  # [B, T+1]
            with torch.inference_mode():
                out = self._forward(input_ids=input_ids, attention_mask=mask, position_ids=batch.next_pos[:, None],
                                    use_cache=True, **{self._cache_kwarg: batch.cache})
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            for layer, (keys, values) in zip(batch.cache.layers, snapshot):  # undo a half-applied step
                layer.keys, layer.values = keys, values
            release_cached_memory(self.device)
            self.stats["oom_splits"] += 1
            log.warning("out of memory in a decode step of %d rows; splitting", len(rows),
                        extra={"event": "engine_oom_split", "phase": "decode", "rows": len(rows)})
            if len(rows) == 1:
                return None, [], [self._error_event(rows[0].request, exc)]
            half = len(rows) // 2
            first, second = list(range(half)), list(range(half, len(rows)))
            b1, r1, e1 = self._decode_rows(batch.select(first), rows[:half])
            b2, r2, e2 = self._decode_rows(batch.select(second), rows[half:])
            merged = KVBatch.merge(b1, b2) if b2 is not None else b1
            return merged, r1 + r2, e1 + e2
        batch.append_column()
        events, alive = self._consume(out.logits[:, -1, :], rows)
        if len(alive) < len(rows):
            batch = batch.select(alive) if alive else None
            rows = [rows[i] for i in alive]
        return batch, rows, events

    def _consume(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[list[TokenEvent], list[int]]:
        """Sample one token per row, turn it into text, decide who finished."""
        tokens = sample_batch(logits, [r.request.params for r in rows], [r.generator for r in rows],
                              [r.seen for r in rows])
        events, alive = [], []
        for i, (row, token) in enumerate(zip(rows, tokens)):
            event = self._advance(row, token)
            events.append(event)
            if not event.finished:
                alive.append(i)
        return events, alive

    def _advance(self, row: _Row, token: int) -> TokenEvent:
        params = row.request.params
        row.generated.append(token)
        row.last_token = token
        if row.seen is not None:
            row.seen = torch.cat([row.seen, row.seen.new_tensor([token])])
        finish = cause = None
        if token in self.eos_ids and not params.ignore_eos:
            text, finish, cause = row.stops.feed(row.detokenizer.flush()), "stop", "eos"
        else:
            text = row.stops.feed(row.detokenizer.add(token))
            if row.stops.stopped:
                finish, cause = "stop", "stop_string"
            elif len(row.generated) >= params.max_tokens:
                finish, cause = "length", "max_tokens"
            elif len(row.request.prompt_ids) + len(row.generated) >= self.context_length:
                finish, cause = "length", "context_limit"
            if cause in ("max_tokens", "context_limit"):
                text += row.stops.feed(row.detokenizer.flush())
                if row.stops.stopped:
                    finish, cause = "stop", "stop_string"
        if finish is not None and not row.stops.stopped:
            text += row.stops.flush()
        return TokenEvent(row.request_id, token, text, finished=finish is not None, finish_reason=finish,
                          finish_cause=cause, prompt_tokens=len(row.request.prompt_ids),
                          completion_tokens=len(row.generated),
                          token_ids=tuple(row.generated) if finish is not None else ())

    def _keep(self, indices: list[int]) -> None:
        self.rows = [self.rows[i] for i in indices]
        self.batch = self.batch.select(indices) if indices else None

    def _error_event(self, request: GenerationRequest, exc: BaseException) -> TokenEvent:
        log.error("out of memory even alone in the batch: %s", exc,
                  extra={"event": "engine_oom", "trace_id": request.trace_id, "prompt_tokens": len(request.prompt_ids)})
        error = OutOfMemoryRowError("out of memory while generating for this request, even alone in its batch. "
                                    "Retry with a shorter prompt or fewer max_tokens")
        return TokenEvent(request.request_id, None, "", finished=True, finish_reason="error", finish_cause="error",
                          prompt_tokens=len(request.prompt_ids), error=error)



def _prepare_model(model, config: EngineConfig):
    model.eval()
    if config.quantize_int8:
        if next(model.parameters()).device.type != "cpu":
            raise InvalidRequestError("int8 dynamic quantization is a CPU option; on CUDA use bf16 or fp16")
        from torch.ao.quantization import quantize_dynamic

        model = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model


def _refuse_sliding_window(config) -> None:
    """The right-aligned batch cache assumes full attention in every layer."""
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise AiengError("this model uses sliding-window or non-standard attention layers, which the aieng engine "
                         "does not batch yet; serve a full-attention model (Llama, Qwen2 without sliding window)",
                         code="unsupported_model")


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache`` in model forwards; support both."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _eos_ids(model, tokenizer) -> set[int]:
    ids = getattr(model.generation_config, "eos_token_id", None) if getattr(model, "generation_config", None) else None
    if ids is None:
        ids = tokenizer.eos_token_id
    return {int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids]) if i is not None}
