"""Constrained decoding: output valid by construction (JSON, a JSON schema, a regex, one of a list).

Each constrained row carries a grammar matcher. Before a step samples, every constrained row's
matcher writes the set of tokens that keep the output inside the grammar as a bitmask; the row's
logits outside it become -inf, so greedy and sampled rows alike can only pick an allowed token,
and free rows in the same batch are untouched. After sampling, the matcher consumes the token;
when the grammar is complete and admits nothing more, the row finishes (``finish_cause``
"grammar") without spending a step on the end-of-sequence token.

The matcher is llguidance's (Microsoft's Rust Earley parser behind vLLM's and SGLang's
``guidance`` backend, no Python dependencies): it writes a batch's masks with no per-schema
index to build first, and compiles a schema directly. outlines-core (TGI's) writes masks as fast
but compiles a JSON schema through a regex (no recursive schemas) into a token index whose build
grows with vocabulary × states, and its vocabulary loader reaches for the Hub. ``aieng bench
grammar`` measures the cost in a served step (docs/performance.md, "Constrained decoding").

A grammar is compiled once per distinct constraint (LRU of ``CACHE_SIZE``) into a template
matcher; a request gets a copy, far cheaper than compiling. Compilation runs where requests are
prepared, off the engine thread; an invalid schema or regex is an ``InvalidRequestError`` naming
the problem.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Literal

import torch

from aieng.errors import InvalidRequestError

CACHE_SIZE = 256
#: Whitespace between JSON tokens: at most 16 characters at a time. Unbounded whitespace (JSON's own
#: rule, llguidance's default) lets a model that is unsure spin on spaces and newlines until
#: max_tokens, as the demo model did under many random schemas. 16 still fits pretty-printed JSON's
#: newline and indentation; a schema's own ``x-guidance`` options override it.
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,16}"}
_LABELS = {"json_object": "JSON object grammar", "json_schema": "JSON schema", "regex": "regex", "choice": "choice"}
_BITS = torch.arange(32, dtype=torch.int32)


@dataclass(frozen=True)
class Constraint:
    """What the output must be. ``spec``: the schema as compact JSON text (``json_schema``), the
    regex (``regex``), the choices as a JSON list (``choice``); empty for ``json_object``."""

    kind: Literal["json_object", "json_schema", "regex", "choice"]
    spec: str = ""
    param: str = "response_format"  # the request field it came from, for error messages

    @classmethod
    def json_schema(cls, schema: dict | bool, param: str = "response_format") -> Constraint:
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError(f"the JSON schema must be an object, got {type(schema).__name__}", param=param)
        # Key order kept: the grammar emits properties in the order the schema declares them.
        return cls("json_schema", json.dumps(schema, separators=(",", ":")), param)

    @classmethod
    def choice(cls, choices: list[str], param: str = "guided_choice") -> Constraint:
        if not choices or any(not isinstance(c, str) or not c for c in choices):
            raise InvalidRequestError("choices must be a non-empty list of non-empty strings", param=param)
        return cls("choice", json.dumps(list(choices)), param)

    def grammar(self) -> str:
        from llguidance import LLMatcher

        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.kind == "json_schema":
            try:
                return LLMatcher.grammar_from_json_schema(self.spec, defaults=JSON_OPTIONS)
            except ValueError as exc:
                raise InvalidRequestError(f"invalid JSON schema: {exc}", param=self.param) from None
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        return LLMatcher.grammar_from_regex("|".join(f"(?:{re.escape(c)})" for c in json.loads(self.spec)))


class ConstraintCompiler:
    """Grammars for one tokenizer: compiled once per constraint, copied per request. Thread-safe."""

    def __init__(self, tokenizer, *, vocab_size: int, eos_id: int):
        self.tokenizer, self.vocab_size, self.eos_id = tokenizer, vocab_size, eos_id
        self._template = functools.lru_cache(maxsize=CACHE_SIZE)(self._compile)  # invalid ones raise, uncached

    def matcher(self, constraint: Constraint):
        """A fresh matcher for one request (an LLMatcher at the grammar's start)."""
        return self._template(constraint).deep_copy()

    def _compile(self, constraint: Constraint):
        from llguidance import LLMatcher

        matcher = LLMatcher(self._ll_tokenizer, constraint.grammar(), log_level=0)
        if matcher.is_error():
            problem = matcher.get_error().strip().splitlines()[0]
            raise InvalidRequestError(f"invalid {_LABELS[constraint.kind]}: {problem}", param=constraint.param)
        return matcher

    @functools.cached_property
    def _ll_tokenizer(self):  # grows with the vocabulary: once per engine, on first use
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_id)


def masks_needed(logits: torch.Tensor, params: list, matchers: list) -> list:
    """The matchers whose rows need a mask this step. A greedy row (no repetition penalty) whose
    own argmax the grammar accepts needs none: the argmax over the allowed tokens is that token.
    Checking one token costs a fraction of writing a mask, and a model that follows its format (the
    demo on its json prompts) is nearly always right (``aieng bench grammar``'s ``json_task``
    workload measures what it saves). Sampled rows are always masked: sampling first and checking
    after would change which draws their seed gives."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return matchers
    greedy = [i for i in rows if params[i].greedy and params[i].repetition_penalty == 1.0]
    best = logits[greedy].argmax(-1).tolist() if greedy else []
    accepted = {i for i, token in zip(greedy, best) if matchers[i].validate_tokens([token]) == 1}
    return [None if i in accepted else m for i, m in enumerate(matchers)]


def mask_logits(logits: torch.Tensor, matchers: list) -> torch.Tensor:
    """``logits`` [B, V] with each constrained row's disallowed tokens at -inf (a new tensor; the
    unconstrained rows, ``None`` in ``matchers``, keep every token). The raw logits stay for
    logprobs. One bitmask for the batch, filled by llguidance's executor across the matchers, then
    one unpack and one ``masked_fill``, cheaper than a mask per row."""
    rows = [(m, i) for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    batch, vocab = logits.shape
    words = (vocab + 31) // 32
    bitmask = torch.full((batch, words), -1, dtype=torch.int32)  # -1: every bit set, every token allowed
    _executor().unsafe_compute_mask_ptr(rows, bitmask.data_ptr(), words * 4, batch)
    allowed = ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().view(batch, -1)[:, :vocab]
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


_EXECUTOR = None


def _executor():
    """llguidance's thread pool for masks, as many threads as torch computes with (the engine
    thread waits on it, so they would idle otherwise)."""
    global _EXECUTOR
    if _EXECUTOR is None:
        from llguidance import LLExecutor

        _EXECUTOR = LLExecutor(max(1, torch.get_num_threads()))
    return _EXECUTOR
