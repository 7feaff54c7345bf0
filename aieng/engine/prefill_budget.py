"""How many prompt tokens the next step may prefill, so running streams keep their pace.

A step that carries a prompt chunk delays every decoding row's next token by the chunk's cost.
A fixed chunk size cannot suit every model: 256 tokens cost a few milliseconds on the demo model
and a few hundred on a 100M-parameter one, where a decode step of 16 rows takes tens. So the
budget adapts: while rows are decoding, a chunk may cost about one decode step (a step with a
chunk then takes about twice a plain one, which bounds the streams' inter-token p99 near 2× the
median step); with nobody decoding, the whole ``max_tokens`` is used, for the fastest first token.

The costs are running averages of what the engine's own steps took: ``decode_s`` from steps
without a chunk, seconds per prompt token from steps with one (their decode share subtracted).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefillBudget:
    max_tokens: int  # the configured ceiling (EngineConfig.prefill_chunk_tokens)
    min_tokens: int = 16  # never starve a joining prompt
    decode_s: float | None = None  # average decode-only step
    token_s: float | None = None  # average prefill cost per prompt token
    weight: float = 0.2  # of the newest sample in the averages

    def tokens(self, decoding: bool) -> int:
        """The chunk budget for the next step (``decoding``: some rows are waiting for a token)."""
        if not decoding:
            return self.max_tokens
        if self.decode_s is None or not self.token_s:  # not measured yet: a small first chunk to learn from
            return min(self.max_tokens, self.min_tokens)
        return int(min(self.max_tokens, max(self.min_tokens, self.decode_s / self.token_s)))

    def observe(self, seconds: float, *, prompt_tokens: int, decoding: bool) -> None:
        """Learn from a step that took ``seconds`` with ``prompt_tokens`` prefilled."""
        if prompt_tokens == 0:
            if decoding:
                self.decode_s = self._mix(self.decode_s, seconds)
            return
        chunk_s = seconds - (self.decode_s or 0.0) if decoding else seconds
        if chunk_s > 0:
            self.token_s = self._mix(self.token_s, chunk_s / prompt_tokens)

    def _mix(self, average: float | None, sample: float) -> float:
        return sample if average is None else (1 - self.weight) * average + self.weight * sample
