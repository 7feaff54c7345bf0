"""What goes into the engine and what comes out of a step.

- ``GenerationRequest``: a validated, tokenized request (``params.validate_request`` ran before
  it was queued; the engine does not validate again).
- ``TokenEvent``: one row's output of one step: the new token and text, and on the last event
  why the row finished. With ``n`` > 1 a request has a row per choice: ``index`` names the
  choice, ``choice_finish`` ends it, and ``finished`` is set once, when the last choice ends.
- ``StepResult``: everything a step produced, events and timings, handed to the scheduler's
  ``update`` (which turns events into deliveries and feeds the observers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aieng.engine.params import SamplingParams
from aieng.engine.sampling import TokenLogprobs
from aieng.errors import AiengError


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    trace_id: str | None = None  # carried into engine-thread log lines
    matcher: object | None = None  # the grammar matcher of ``params.constraint`` (constraints.py), at its start


@dataclass
class TokenEvent:
    request_id: str
    token_id: int | None
    text: str  # the new text (may be empty while a character or a possible stop string is incomplete)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "error"
    finish_cause: str | None = None  # "eos" | "stop_string" | "grammar" | "max_tokens" | "context_limit" | "error"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those read from the prefix cache (not prefilled)
    completion_tokens: int = 0
    error: AiengError | None = None
    token_ids: tuple[int, ...] = ()  # all generated ids, on the finishing event only
    logprobs: TokenLogprobs | None = None  # this token's, when the request asked for logprobs
    index: int = 0  # the choice this event belongs to (n > 1)
    prompt_logprobs: tuple | None = (
        None  # on a choice's first event, when asked: each prompt token's (sampling.prompt_logprobs)
    )
    choice_finish: str | None = None  # set on the event that ends choice ``index``: its finish reason


def prefix_step(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """A step's share of the prefix cache's running totals (``Runner.prefix_counts``)."""
    if before is None or after is None:
        return None
    return {**{k: after[k] - before[k] for k in ("hit", "miss", "evicted")}, "kept": after["kept"]}


def error_event(request_id: str, error: AiengError, *, prompt_tokens: int = 0) -> TokenEvent:
    """The final event of a request that failed (out of memory, deadline, engine failure)."""
    return TokenEvent(
        request_id,
        None,
        "",
        finished=True,
        finish_reason="error",
        finish_cause="error",
        prompt_tokens=prompt_tokens,
        error=error,
    )


@dataclass(frozen=True)
class StepSplit:
    """Where one forward-and-sample of the engine went, in seconds: the decoder layers (with their
    inputs' tensors), the output projection over the vocabulary, sampling the next tokens (with
    their detokenization and stop checks), and the rest of the step's Python (events, bookkeeping).
    ``head_s`` None: the runner does not time the projection apart (transformers' forward), and
    ``layers_s`` includes it."""

    layers_s: float
    head_s: float | None
    sampling_s: float
    other_s: float

    @property
    def total_s(self) -> float:
        return self.layers_s + (self.head_s or 0.0) + self.sampling_s + self.other_s


@dataclass
class StepResult:
    """One iteration of continuous batching: joiners prefilled, then every running row decoded."""

    events: list[TokenEvent] = field(default_factory=list)
    prefill_s: float | None = None  # None: nobody joined this step
    decode_s: float | None = None  # None: no row was decoded
    decoded_rows: int = 0  # rows in the decode step (the batch size the metrics observe)
    prefill_tokens: int = 0  # prompt tokens prefilled in this step (chunks, unpadded)
    kv_rows: int = 0  # rows holding KV cache after the step, of ``kv_rows_total`` the engine holds now
    kv_rows_total: int = 0
    kv_tokens: int = 0  # tokens those rows keep in the cache, of ``kv_rows_total`` x the context length
    kv_tokens_total: int = 0
    oom_splits: dict[str, int] = field(default_factory=dict)  # phase -> out-of-memory splits in this step
    # The prefix cache in this step: prompt tokens read from it (``hit``) and prefilled (``miss``),
    # tokens ``evicted``, and the tokens ``kept`` for reuse after it (None: no prefix cache).
    prefix: dict[str, int] | None = None
