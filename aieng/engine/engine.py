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
    compile: bool = False  # torch.compile prefill and decode (see `_compile_forward`); `aieng serve` turns it on
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
        self._compiled_forward = _compile_forward(self.model) if config.compile else None
        self.compiled = config.compile
        self._warmed = False  # compiled graphs exist for every form the engine calls: guards may be skipped
        self._rewarming = False  # a form warm-up missed is being compiled with full guards
        self._cache_kwarg = _cache_kwarg(self.model)
        _refuse_sliding_window(model.config)
        self.batch: KVBatch | None = None
        self.rows: list[_Row] = []
        self.stats = {"prefill_calls": 0, "decode_steps": 0, "oom_splits": 0, "rewarms": 0, "compile_fallbacks": 0}
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
    # The batch's tensors are all created under inference_mode (the cache is an input of the
    # compiled decode graph, and a tensor's inference-ness is part of what that graph was built for).
    @torch.inference_mode()
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

    @torch.inference_mode()
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

    @torch.inference_mode()
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
        self._warmed = True
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
        if self.compiled:
            longest = max(longest, 2)  # a 1-token prompt gets one pad column: length 1 would be a graph of its own
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
        # Compiled: always a mask, so padded and unpadded groups share a graph.
        pass_mask = self.compiled or bool((mask == 0).any())
        try:
            out = self._forward(input_ids=input_ids, attention_mask=mask if pass_mask else None,
                                position_ids=positions, use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        except Exception as exc:
            if not self._recover_from_compile_error(exc):
                raise
            return self._prefill_group(requests)  # nothing was kept from the failed call: start over
        self.stats["prefill_calls"] += 1
        new_batch = KVBatch(cache, mask, mask.sum(-1)).make_contiguous()  # the model filled `cache` in place
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
            # Compiled: every step carries a mask, so one graph serves padded and unpadded batches
            # (a None-or-tensor argument would be a second graph, and a lone padded row, such as
            # a 1-token prompt padded to 2, a form warm-up never built).
            if batch.padded or self.compiled:
                mask = torch.cat([batch.mask, torch.ones((batch.size, 1), dtype=batch.mask.dtype,
                                                         device=batch.mask.device)], dim=1)  # [B, T+1]
            out = self._forward(input_ids=input_ids, attention_mask=mask, position_ids=batch.next_pos[:, None],
                                use_cache=True, **{self._cache_kwarg: batch.cache})
        except Exception as exc:
            for layer, (keys, values) in zip(batch.cache.layers, snapshot):  # undo a half-applied step
                layer.keys, layer.values = keys, values
            if self._recover_from_compile_error(exc):
                return self._decode_rows(batch, rows)
            if not is_out_of_memory(exc):
                raise
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

    def _forward(self, **inputs):
        """The model's forward: compiled (guards skipped once warm) or eager."""
        if not self.compiled:
            return self.model.forward(**inputs)
        if self._warmed:
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                return self._compiled_forward(**inputs)
        out = self._compiled_forward(**inputs)
        if self._rewarming:  # the missing graph now exists: skipping guards is safe again
            self._rewarming, self._warmed = False, True
        return out

    def _recover_from_compile_error(self, exc: BaseException) -> bool:
        """True when ``exc`` came from torch.compile and the call may simply be retried.

        Only compiler errors count: a model or input error raised inside a compiled call would
        be raised again eagerly, and must not switch compilation off for the whole process.
        """
        if not self.compiled or is_out_of_memory(exc):
            return False
        if self._warmed and "skip_guard_eval_unsafe" in str(exc):
            self._rewarm(exc)
            return True
        if isinstance(exc, torch._dynamo.exc.TorchDynamoException):  # includes inductor's errors
            self._fall_back_to_eager(exc)
            return True
        return False

    def _rewarm(self, exc: BaseException) -> None:
        """A shape warm-up did not cover: compile it with full guards, then skip them again."""
        log.warning("a forward call needed a graph warm-up did not compile (%s); compiling it now",
                    str(exc).splitlines()[0], extra={"event": "engine_compile_rewarm"})
        self.stats["rewarms"] += 1
        self._warmed, self._rewarming = False, True

    def _fall_back_to_eager(self, exc: BaseException) -> None:
        """A model torch.compile cannot handle still serves, eagerly; say so once, loudly."""
        log.warning("torch.compile failed for this model (%s: %s); continuing eagerly",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                    extra={"event": "engine_compile_fallback"})
        self.stats["compile_fallbacks"] += 1
        self.compiled = False

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
        from aieng.engine.quantize import quantize_int8

        model = quantize_int8(model)
    return model


def _compile_forward(model):
    """``torch.compile`` the model's forward for prefill and decode.

    Why: on a small model a step's time is mostly Python and operator dispatch, which the compiled
    graph removes (``aieng bench engine`` measures it against the eager loop in the same run).
    ``dynamic=True`` keeps batch size, prompt length and KV length symbolic, so the engine needs a
    handful of graphs, all compiled during ``warmup()``: prefill and decode, each for one row and
    for several (dynamo specialises size 1). To keep it to that handful, compiled calls always pass
    an attention mask (None-or-tensor would double the graphs), prompts shorter than 2 tokens are
    padded to 2, and cache tensors are always contiguous (``KVBatch.make_contiguous``). Inductor's
    on-disk cache makes later starts faster.

    ``cpp_wrapper`` generates the code that calls the kernels in C++ instead of Python, and after
    ``warmup()`` calls run under ``skip_guard_eval_unsafe`` (only the guards that tell the warmed
    graphs apart are evaluated). At batch 1 each roughly halves what is left of a decode step on
    the demo model. Should a call still need a new graph, the engine turns full guards back on
    (``_rewarm``); ``tests/engine/test_compile.py`` checks that a mixed schedule needs none.
    """
    return torch.compile(model.forward, dynamic=True, options={"cpp_wrapper": True})


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
