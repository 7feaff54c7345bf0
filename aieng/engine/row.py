"""One running row: its sampler state, its text so far, and the rule for when it is finished.

A row finishes on the first of: an end-of-sequence token (unless ``ignore_eos``), a stop string,
its grammar complete (a constrained row), ``max_tokens``, or the model's context length. Text is
released only when it is safe: a multi-byte character is never split, and nothing that could
still become a stop string is streamed (see ``stops`` and ``detokenize``). The text is what the
row's tokens add after its prompt (``detokenize``: decoded in the prompt's context, so a
SentencePiece reply whose first token is ``▁Paris`` reads " Paris"), and stop strings are matched
on that same text: every choice of a request (``choices``) starts from the same prompt context.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from aieng.engine.constraints import mask_logits, masks_needed
from aieng.engine.detokenize import IncrementalDetokenizer
from aieng.engine.request import GenerationRequest, TokenEvent, error_event
from aieng.engine.sampling import TokenLogprobs, adjust_logits, new_generator, sample_batch, token_logprobs
from aieng.engine.stops import StopMatcher
from aieng.errors import AiengError

log = logging.getLogger("aieng.engine")


class RowFailedError(AiengError):
    """One request's sampling or detokenization raised: that request ends, its batch-mates go on."""

    code = "row_failed"
    status = 500
    type = "server_error"
    request_path = True


@dataclass
class Row:
    request: GenerationRequest
    generator: torch.Generator
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    seen: torch.Tensor | None  # prompt + generated ids, only when repetition_penalty != 1
    generated: list[int] = field(default_factory=list)
    last_token: int = -1
    matcher: object | None = None  # the grammar matcher when the request is constrained (constraints.py)
    prompt_logprobs: tuple | None = None  # the prompt's logprobs when asked, sent with the first event
    cached_tokens: int = 0  # prompt tokens its KV row had from the prefix cache (usage's cached_tokens)

    @classmethod
    def start(cls, request: GenerationRequest, tokenizer, device: torch.device) -> Row:
        params = request.params
        seen = (
            torch.tensor(request.prompt_ids, dtype=torch.long, device=device)
            if params.repetition_penalty != 1.0
            else None
        )
        return cls(
            request=request,
            generator=new_generator(params.seed, device),
            detokenizer=IncrementalDetokenizer(tokenizer, prompt_ids=request.prompt_ids),
            stops=StopMatcher(params.stop),
            seen=seen,
            matcher=request.matcher,
        )

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def advance(
        self, token: int, *, eos_ids: set[int], context_length: int, logprobs: TokenLogprobs | None = None
    ) -> TokenEvent:
        """Take the token sampled for this row; return its event (``finished`` when the row is done)."""
        params = self.request.params
        self.generated.append(token)
        self.last_token = token
        if self.seen is not None:
            self.seen = torch.cat([self.seen, self.seen.new_tensor([token])])
        complete = False  # the grammar is complete and admits nothing more
        if self.matcher is not None:
            if not self.matcher.consume_token(token):
                raise RuntimeError(
                    f"the grammar refused token {token} its own mask allowed: {self.matcher.get_error()}"
                )
            complete = self.matcher.is_stopped()
        finish = cause = None
        if token in eos_ids and not params.ignore_eos:
            text, finish, cause = self.stops.feed(self.detokenizer.flush()), "stop", "eos"
        else:
            text = self.stops.feed(self.detokenizer.add(token))
            if self.stops.stopped:
                finish, cause = "stop", "stop_string"
            elif complete:
                finish, cause = "stop", "grammar"
            elif len(self.generated) >= params.max_tokens:
                finish, cause = "length", "max_tokens"
            elif len(self.request.prompt_ids) + len(self.generated) >= context_length:
                finish, cause = "length", "context_limit"
            if cause in ("grammar", "max_tokens", "context_limit"):  # the last token: release held-back text
                text += self.stops.feed(self.detokenizer.flush())
                if self.stops.stopped:
                    finish, cause = "stop", "stop_string"
        return self._event(token, text, finish, cause, logprobs)

    def truncate(self, cause: str) -> TokenEvent:
        """End now with what was generated, as if ``max_tokens`` had been reached (the degraded
        out-of-memory mode, ``oom.py``): finish_reason ``length``, ``finish_cause`` says why."""
        text = self.stops.feed(self.detokenizer.flush())
        finish, cause = ("stop", "stop_string") if self.stops.stopped else ("length", cause)
        return self._event(None, text, finish, cause)

    def _event(
        self, token: int | None, text: str, finish: str | None, cause: str | None, logprobs: TokenLogprobs | None = None
    ) -> TokenEvent:
        """This step's event; a finishing one releases the text held back for a possible stop string."""
        if finish is not None and not self.stops.stopped:
            text += self.stops.flush()
        return TokenEvent(
            self.request_id,
            token,
            text,
            finished=finish is not None,
            finish_reason=finish,
            finish_cause=cause,
            prompt_tokens=len(self.request.prompt_ids),
            cached_tokens=self.cached_tokens,
            completion_tokens=len(self.generated),
            token_ids=tuple(self.generated) if finish is not None else (),
            logprobs=logprobs,
            choice_finish=finish,
            prompt_logprobs=self.prompt_logprobs if token is not None and len(self.generated) == 1 else None,
        )


def sample_rows(
    rows: Sequence[Row], logits: torch.Tensor, *, eos_ids: set[int], context_length: int
) -> list[TokenEvent]:
    """One step's tokens for ``rows`` from their ``logits`` [B, V]: sampled, their logprobs where asked
    for, and each row's event."""
    params = [row.request.params for row in rows]
    adjusted = adjust_logits(logits, params, [row.generated for row in rows])  # penalties and bias, where asked
    allowed = mask_logits(adjusted, masks_needed(adjusted, params, [row.matcher for row in rows]))
    tokens = sample_batch(allowed, params, [row.generator for row in rows], [row.seen for row in rows])
    return advance_rows(
        rows, tokens, eos_ids=eos_ids, context_length=context_length, logprobs=token_logprobs(logits, tokens, params)
    )


def advance_rows(
    rows: Sequence[Row],
    tokens: Sequence[int | Exception],
    *,
    eos_ids: set[int],
    context_length: int,
    logprobs: Sequence[TokenLogprobs | None] | None = None,
) -> list[TokenEvent]:
    """Each row's event for its sampled token (``sampling.sample_batch``). A row whose sampling
    raised (the exception stands in for its token) or whose detokenization or stop matching
    raises ends alone with ``RowFailedError``, logged with its trace id; the others carry on."""
    events = []
    for i, (row, token) in enumerate(zip(rows, tokens)):
        stage = "sampling" if isinstance(token, Exception) else "detokenization"
        try:
            if isinstance(token, Exception):
                raise token
            events.append(
                row.advance(
                    token, eos_ids=eos_ids, context_length=context_length, logprobs=logprobs[i] if logprobs else None
                )
            )
        except Exception as exc:  # noqa: BLE001 - confined to this row
            log.error(
                "%s failed for one request; failing it alone: %r",
                stage,
                exc,
                exc_info=exc,
                extra={"event": "engine_row_failed", "stage": stage, "trace_id": row.request.trace_id},
            )
            error = RowFailedError(
                f"internal error in the {stage} of this request (trace id "
                f"{row.request.trace_id}); other requests were not affected. Retry it, and "
                "report the trace id if it happens again"
            )
            events.append(error_event(row.request_id, error, prompt_tokens=len(row.request.prompt_ids)))
    return events
