"""The generation engine: prefill and decode over a running batch that rows join and leave
between steps (continuous batching), with per-row sampling, stops and streaming.

Contract with whoever drives it (the scheduler's engine thread, or ``generate``/``stream`` here):

- ``step(joiners, leaving)`` is one iteration: drop the ``leaving`` rows (cancelled, timed out),
  admit the ``joiners``, prefill the next prompt chunks (at most ``prefill_chunk_tokens`` a step,
  so a long prompt joins over several steps while the running rows keep decoding) and decode one
  token for every decoding row. It returns a ``StepResult``: the events and the timings.
- ``prefill``, ``decode`` and ``remove`` are the parts, public for tools that time them separately
  (``aieng.bench.step_profile``, notebook 04).

The tensors live in a runner: the native Llama-family forward over a static slot cache, or the
transformers forward over a dynamic cache, as ``serving_path`` decides (it refuses the rest).
Requests arrive validated (``params.validate_request``). A finished row (EOS, stop string,
``max_tokens``, context limit) leaves in the step that reports it. One thread owns the engine. It
owns no scheduling policy: which requests join is the scheduler's business, and ``max_rows`` says
how many it may hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from aieng.engine import conveniences
from aieng.engine.choices import ChoiceGroups
from aieng.engine.config import EngineConfig
from aieng.engine.constraints import ConstraintCompiler
from aieng.engine.hf_model import pad_token_id, prepare_model
from aieng.engine.native.onednn_caches import bound_onednn_caches
from aieng.engine.oom import out_of_memory_event
from aieng.engine.params import GenerationResult, SamplingParams, validate_request
from aieng.engine.prefill_budget import PrefillBudget
from aieng.engine.request import GenerationRequest, StepResult, StepSplit, TokenEvent, prefix_step
from aieng.engine.row import Row, sample_rows
from aieng.engine.runner import Chunk
from aieng.engine.runner_choice import make_runner
from aieng.engine.sampling import prompt_logprobs
from aieng.engine.shared_prefill import find_leader, follow_leaders
from aieng.model_facts import eos_token_ids, model_context_length

log = logging.getLogger("aieng.engine")


class Engine:
    def __init__(
        self,
        model,
        tokenizer,
        *,
        context_length: int | None = None,
        config: EngineConfig = EngineConfig(),
        replacing: Engine | None = None,
        kv_from_replaced: bool = False,
    ):
        """``replacing``: the engine this one takes over from in a hot swap; with weights of the
        same layout it takes that engine's format plan and compiled graphs, and with
        ``kv_from_replaced`` its KV memory (``succession`` says how and why)."""
        bound_onednn_caches()  # before this process's first oneDNN multiply (onednn_caches.py)
        self.config = config
        self.tokenizer = tokenizer
        self.model = prepare_model(model, quantize_int8=config.quantize_int8, context_length=context_length)
        self.device = next(model.parameters()).device
        self.context_length = context_length or model_context_length(model)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = pad_token_id(tokenizer, self.eos_ids)
        self.constraints = ConstraintCompiler(
            tokenizer,
            vocab_size=model.config.vocab_size,
            eos_id=(tokenizer.eos_token_id if tokenizer.eos_token_id in self.eos_ids else min(self.eos_ids)),
        )
        self.runner = make_runner(
            self.model,
            config=config,
            context_length=self.context_length,
            pad_id=self.pad_id,
            replacing=replacing,
            kv_from_replaced=kv_from_replaced,
        )
        self.rows: dict[str, Row] = {}  # every admitted row: prefilling or decoding
        self.prefilling: list[Row] = []  # admitted, prompt not all in the cache yet (FIFO)
        self.prefilled: dict[str, int] = {}  # prompt tokens already in the cache, per prefilling row
        self.leaders: dict[str, tuple[str, int]] = {}  # follower -> (leader, shared tokens): shared_prefill.py
        self.choices = ChoiceGroups()  # requests with n > 1: their rows (choices.py)
        self.last_split: StepSplit | None = None  # where the last forward-and-sample went (bench engine)
        self.counts = {"prefill_calls": 0, "decode_steps": 0}
        self.prefill_budget = PrefillBudget(config.prefill_chunk_tokens)  # adapts the chunk to the decode pace

    @property
    def compiled(self) -> bool:
        return self.runner.compiled

    @property
    def compile_status(self) -> str:
        """eager | compiling | compiled | failed."""
        return self.runner.compile_status

    def wait_for_compile(self, timeout: float | None = None) -> str:
        """Block until a background compilation is done (before a fork, which would lose its thread)."""
        self.runner.wait_for_compile(timeout)
        return self.compile_status

    @property
    def max_rows(self) -> int:
        return self.runner.max_rows

    def prefix_counts(self) -> dict[str, int] | None:
        """The prefix cache's running totals (prompt tokens ``hit``, ``miss``, ``evicted``) and the
        tokens it keeps now (``kept``); None without one (``Runner.prefix_counts``)."""
        return self.runner.prefix_counts()

    def one_row_step_bytes(self) -> int:
        """Bytes of weights one batch-1 decode step reads (its ceiling: ``aieng bench memory``)."""
        return self.runner.one_row_step_bytes()

    @property
    def planned_rows(self) -> int:
        return self.runner.planned_rows

    @property
    def chunked(self) -> bool:
        """Prompts prefill in chunks beside decoding rows (the native forward), not whole."""
        return self.runner.chunked

    @property
    def compiling_inline(self) -> bool:
        """A step is compiling a graph warm-up missed (the transformers path's rewarm): slow, not hung."""
        return self.runner.compiling_inline

    @property
    def stats(self) -> dict[str, int]:
        return {**self.counts, "oom_splits": sum(self.runner.oom_splits.values()), **self.runner.compile_counts()}

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)["input_ids"]

    @property
    def num_running(self) -> int:
        return len(self.rows)

    def running_ids(self) -> list[str]:
        return list(self.rows)

    # -- one iteration of continuous batching ---------------------------------------------------
    def step(self, joiners: Sequence[GenerationRequest] = (), leaving: Sequence[str] = ()) -> StepResult:
        """Drop ``leaving``, admit ``joiners``, then one forward: prompt chunks and every decoding row."""
        counted = self.runner.prefix_counts()
        self.remove(leaving)
        events = self._admit(joiners)
        chunks = self._plan_chunks()
        decoding = self.runner.decoding_ids()
        if not chunks and not decoding:
            return StepResult(events)
        splits = dict(self.runner.oom_splits)
        events += self._forward(chunks, decoding)
        return StepResult(
            events,
            prefill_s=self._last.prefill_s,
            decode_s=self._last.decode_s,
            decoded_rows=len(decoding),
            prefill_tokens=sum(len(c.token_ids) for c in chunks),
            kv_rows=len(self.rows),
            kv_rows_total=self.max_rows,
            kv_tokens=sum(len(row.request.prompt_ids) + len(row.generated) for row in self.rows.values()),
            kv_tokens_total=self.max_rows * self.context_length,
            oom_splits={k: n - splits[k] for k, n in self.runner.oom_splits.items() if n > splits[k]},
            prefix=prefix_step(counted, self.runner.prefix_counts()),
        )

    def prefill(self, requests: Sequence[GenerationRequest]) -> list[TokenEvent]:
        """Admit ``requests`` and prefill until their prompts are in (no decode); their first tokens."""
        events = self._admit(requests)
        wanted = {r.request_id for r in requests}
        while any(row.request_id in wanted for row in self.prefilling):
            events += self._forward(self._plan_chunks(), [])
        return events

    def decode(self) -> list[TokenEvent]:
        """One decode step for every decoding row."""
        decoding = self.runner.decoding_ids()
        return self._forward([], decoding) if decoding else []

    def remove(self, request_ids: Sequence[str]) -> list[str]:
        """Drop rows (cancelled, timed out); returns the ids that were running."""
        removed = [rid for rid in self.choices.rows_of(request_ids) if rid in self.rows]
        if removed:
            self.choices.drop(removed)
            self._drop(removed)
        return removed

    # -- conveniences built on the steps (conveniences.py) -------------------------------------
    def generate(
        self,
        prompts: Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        max_batch_size: int = 64,
    ) -> list[GenerationResult]:
        """Run prompts to completion, at most ``max_batch_size`` rows at a time; results in prompt order."""
        return conveniences.generate(self, prompts, params, max_batch_size=max_batch_size)

    def stream(
        self, prompt: str | list[int], params: SamplingParams, request_id: str = "stream-0"
    ) -> Iterator[TokenEvent]:
        """Yield the events of one request as they are produced (alone in the batch)."""
        return conveniences.stream(self, prompt, params, request_id)

    @property
    def shared_graphs(self) -> bool:
        """True when this engine runs the compiled graphs of the engine it replaced."""
        return self.runner.shared_graphs

    def warmup(self, progress: Callable[[str], None] | None = None) -> float:
        """Run representative shapes so the first real request pays no lazy set-up, and build the
        compiled graphs (``progress(detail)`` hears about each shape as it starts).

        Native forward: the shapes run eagerly, then the decoder layer is compiled; with a
        ``compile_budget_s`` the compilation goes on in the background past the budget while the
        engine serves eagerly, and decode steps switch to the graphs when they are ready.
        """
        from aieng.engine.warmup import warm_up

        return warm_up(self, progress or (lambda detail: None))

    # -- internals -----------------------------------------------------------------------------
    def _request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> GenerationRequest:
        """A request for the conveniences above, validated here: they are their own front door."""
        ids = prompt if isinstance(prompt, list) else self.encode(prompt)
        validate_request(len(ids), params, self.context_length)
        matcher = self.constraints.matcher(params.constraint) if params.constraint else None
        return GenerationRequest(request_id, ids, params, matcher=matcher)

    def _admit(self, requests: Sequence[GenerationRequest]) -> list[TokenEvent]:
        events = []
        for request in requests:  # rows held, and the other choices of prompts still prefilling
            if len(self.rows) + sum(r.request.params.n - 1 for r in self.prefilling) + request.params.n > self.max_rows:
                events.append(out_of_memory_event(request, None))
                continue
            cached = self.runner.admit(request.request_id, request.prompt_ids)  # a prefix cache hit
            row = Row.start(request, self.tokenizer, self.device)
            row.cached_tokens = cached
            if lead := find_leader(self, request.prompt_ids, cached):
                self.leaders[request.request_id] = lead
            if (k := request.params.prompt_logprobs) is not None:  # a scoring request: a second, plain forward
                row.prompt_logprobs = prompt_logprobs(self.model, request.prompt_ids, k, self.device)
            self.rows[request.request_id] = row
            self.prefilling.append(row)
            self.prefilled[request.request_id] = cached
        return events

    def _plan_chunks(self) -> list[Chunk]:
        """The next prompt chunks, oldest first, within the step's prefill budget (padded tokens:
        chunks are right-padded to the widest; ``prefill_budget`` adapts it to the decode pace).
        The transformers runner takes whole prompts."""
        budget = self.prefill_budget.tokens(bool(self.runner.decoding_ids())) if self.runner.chunked else None
        chunks: list[Chunk] = []
        width = 0
        waiting = follow_leaders(self) if self.leaders else ()
        for row in (r for r in self.prefilling if r.request_id not in waiting):
            prompt, done = row.request.prompt_ids, self.prefilled[row.request_id]
            take = len(prompt) - done if budget is None else min(len(prompt) - done, budget)
            if budget is not None and chunks and (len(chunks) + 1) * max(width, take) > budget:
                break
            width = max(width, take)
            chunks.append(Chunk(row.request_id, prompt[done : done + take], done, last=done + take == len(prompt)))
        return chunks

    @torch.inference_mode()
    def _forward(self, chunks: list[Chunk], decoding: list[str]) -> list[TokenEvent]:
        started = time.perf_counter()
        decode_rows = [self.rows[rid] for rid in decoding]
        out = self._last = self.runner.forward(chunks, [row.last_token for row in decode_rows])
        forward_s = time.perf_counter() - started
        sampling_s = 0.0
        if self.runner.chunked and not out.failed:
            padded = len(chunks) * max((len(c.token_ids) for c in chunks), default=0)
            self.prefill_budget.observe(
                out.prefill_s or out.decode_s or 0.0, prompt_tokens=padded, decoding=bool(decoding)
            )
        self.counts["prefill_calls"] += bool(chunks)
        self.counts["decode_steps"] += bool(decoding)
        events = [
            out_of_memory_event(self.rows[rid].request, exc, row=self.rows[rid], degrade=self.config.oom_degrade)
            for rid, exc in out.failed.items()
        ]
        for chunk in chunks:
            if chunk.request_id not in out.failed:
                self.prefilled[chunk.request_id] += len(chunk.token_ids)
        done = [self.rows[c.request_id] for c in chunks if c.last and c.request_id not in out.failed]
        sampled_rows, logits, forks = [], [], []
        if done and out.prefill is not None:
            forks, parents = self._fork(done)  # n > 1: the other choices, sampled from their prompt's logits
            sampled_rows += done + forks
            logits += [out.prefill, out.prefill[parents]] if forks else [out.prefill]
        if decode_rows:
            keep = [i for i, row in enumerate(decode_rows) if row.request_id not in out.failed]
            sampled_rows += [decode_rows[i] for i in keep]
            logits.append(out.decode if len(keep) == len(decode_rows) else out.decode[keep])
        finished = set(out.failed)
        if sampled_rows:
            sampling_start = time.perf_counter()
            sampled = sample_rows(
                sampled_rows, torch.cat(logits), eos_ids=self.eos_ids, context_length=self.context_length
            )
            sampling_s = time.perf_counter() - sampling_start
            for row, event in zip(sampled_rows, sampled):
                events.append(event)
                if event.finished:
                    finished.add(row.request_id)
        events, doomed = self.choices.publish(events)
        finished.update(doomed)
        self.prefilling = [row for row in self.prefilling if row not in done and row.request_id not in finished]
        self.runner.start_decoding([row.request_id for row in done + forks if row.request_id not in finished])
        if finished:
            self._drop(list(finished))
        head_s = out.head_s
        self.last_split = StepSplit(
            layers_s=forward_s - (head_s or 0.0),
            head_s=head_s,
            sampling_s=sampling_s,
            other_s=time.perf_counter() - started - forward_s - sampling_s,
        )
        return events

    def _fork(self, done: list[Row]) -> tuple[list[Row], list[int]]:
        """Rows for the other choices of ``done`` rows with n > 1, on copies of their caches; and for
        each, the position of its prompt's logits among ``done``'s."""
        forks, parents = [], []
        for position, parent in enumerate(done):
            children = self.choices.children(parent.request)
            if children:
                self.runner.fork(parent.request_id, [child.request_id for child in children])
            for child in children:
                forks.append(self.rows.setdefault(child.request_id, Row.start(child, self.tokenizer, self.device)))
                forks[-1].prompt_logprobs, forks[-1].cached_tokens = parent.prompt_logprobs, parent.cached_tokens
                parents.append(position)
        return forks, parents

    @torch.inference_mode()  # the batch's tensors are inference tensors (a compiled graph is built for them)
    def _drop(self, request_ids: list[str]) -> None:
        self.runner.release(request_ids)
        doomed = set(request_ids)
        self.prefilling = [row for row in self.prefilling if row.request_id not in doomed]
        for rid in request_ids:
            self.rows.pop(rid, None)
            self.prefilled.pop(rid, None)
