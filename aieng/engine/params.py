"""Sampling parameters and their validation: one precise message per rule (the TGI way).

``validate_request`` is the single check a request passes, before it is queued (the server runs
it off the event loop, right after tokenizing; ``Engine.generate`` runs it for its own callers).
The engine thread never validates: a raise there would fail every row of the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aieng.errors import InvalidRequestError

if TYPE_CHECKING:  # constraints.py imports torch; requests and the store read these without it
    from aieng.engine.constraints import Constraint

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_CHOICES = 16  # n: choices per request (each a row of the batch)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat's top_logprobs (its completions allow 5, vLLM 20 on both)


GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 (anything below GREEDY_BELOW) means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k filter
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep generating past EOS (benchmarks need a fixed token count)
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the k most likely ones
    constraint: Constraint | None = None  # the output must match it (constraints.py)
    n: int = 1  # choices: rows sharing the prompt's prefill, each sampled on its own (choices.py)
    prompt_logprobs: int | None = None  # also the prompt tokens' logprobs, with k alternatives (echo + logprobs)
    presence_penalty: float = 0.0  # OpenAI's: subtracted from the logit of every token generated so far
    frequency_penalty: float = 0.0  # OpenAI's: subtracted once per time a token was generated so far
    logit_bias: tuple[tuple[int, float], ...] = ()  # OpenAI's: (token id, bias in [-100, 100]) added to the logits

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    @property
    def greedy(self) -> bool:
        """Argmax decoding. A temperature below ``GREEDY_BELOW`` counts as 0, as vLLM does: dividing
        logits by 1e-38 overflows to inf and the draw fails on NaN probabilities."""
        return self.temperature < GREEDY_BELOW

    def validate(self) -> SamplingParams:
        if self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}", param="max_tokens")
        for name in ("temperature", "top_p", "repetition_penalty"):  # JSON parsers accept NaN and Infinity
            if not math.isfinite(getattr(self, name)):
                raise InvalidRequestError(f"{name} must be a finite number, got {getattr(self, name)}", param=name)
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}", param="temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be > 0 and <= 1, got {self.top_p}", param="top_p")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k}", param="top_k")
        if self.repetition_penalty <= 0:
            raise InvalidRequestError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}", param="repetition_penalty"
            )
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}", param="stop"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs}", param="logprobs"
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.prompt_logprobs}", param="logprobs"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2 <= value <= 2):
                raise InvalidRequestError(f"{name} must be between -2 and 2, got {value}", param=name)
        for token, bias in self.logit_bias:
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                raise InvalidRequestError(
                    f"logit_bias values must be between -100 and 100, got {bias} for token {token}", param="logit_bias"
                )
        if not 1 <= self.n <= MAX_CHOICES:
            raise InvalidRequestError(f"n must be between 1 and {MAX_CHOICES}, got {self.n}", param="n")
        if any(s == "" for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", param="stop")
        return self


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens or context limit)
    prompt_tokens: int
    completion_tokens: int
    token_ids: tuple[int, ...] = ()  # generated ids (EOS included when generated), for parity checks


def validate_request(prompt_tokens: int, params: SamplingParams, context_length: int) -> None:
    """The one validation of a request, before it is queued: its parameters, then an empty prompt
    or one that cannot fit with its ``max_tokens`` in the context. Raises InvalidRequestError (400)."""
    params.validate()
    if prompt_tokens == 0:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    requested = prompt_tokens + params.max_tokens
    if requested > context_length:
        raise InvalidRequestError(
            f"This model's maximum context length is {context_length} tokens, "
            f"but {requested} tokens were requested "
            f"({prompt_tokens} in the prompt + {params.max_tokens} max_tokens). "
            "Shorten the prompt or lower max_tokens.",
            param="prompt",
            code="context_length_exceeded",
        )
