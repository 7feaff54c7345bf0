"""How many prompt tokens the next step may prefill, so running streams keep their pace.

A step that carries a prompt chunk delays every decoding row's next token by the chunk's cost.
A fixed chunk size cannot suit every model: 256 tokens cost a few milliseconds on the demo model
and a few hundred on a 100M-parameter one, where a decode step of 16 rows takes tens. So the
budget adapts to what the engine's own steps cost.

What a chunk adds to a step is a fixed part (per-layer Python when the step runs eagerly, paid whatever
the chunk's size) plus a part per prompt token. Both are learned by a running least-squares fit of
the extra seconds against the chunk's tokens (while the chunk sizes vary; before that, the average
cost per token stands in). The budget is then the larger of:

- the tokens whose cost fits in one decode step beside the fixed part, so a step with a chunk
  takes about twice a plain one: the streams' inter-token p99 stays near 2x the median step
  (what matters on real models, where the per-token part dominates);
- the tokens whose cost equals the fixed part, so a chunk always spends at least half its time
  on prompt tokens: on a tiny model, where the fixed part alone exceeds a decode step, small
  chunks would pay that overhead over and over (many joiners prefilled one at a time) and cut
  throughput for no gain in pace.

With nobody decoding, the whole ``max_tokens`` is used, for the fastest first token.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefillBudget:
    max_tokens: int  # the configured ceiling (EngineConfig.prefill_chunk_tokens)
    min_tokens: int = 16  # never starve a joining prompt
    decode_s: float | None = None  # average decode-only step
    token_s: float | None = None  # average cost per prompt token (fixed part included)
    weight: float = 0.2  # of the newest sample in the averages
    # running means of the chunk steps' tokens t and extra seconds s, for the fit s = fixed + t * per_token
    _t: float | None = None
    _s: float = 0.0
    _tt: float = 0.0
    _ts: float = 0.0

    def tokens(self, decoding: bool) -> int:
        """The chunk budget for the next step (``decoding``: some rows are waiting for a token)."""
        if not decoding:
            return self.max_tokens
        if self.decode_s is None or not self.token_s:  # not measured yet: a small first chunk to learn from
            return min(self.max_tokens, self.min_tokens)
        fixed, per_token = self.cost_model()
        wanted = max(self.decode_s - fixed, fixed) / per_token
        return int(min(self.max_tokens, max(self.min_tokens, wanted)))

    def cost_model(self) -> tuple[float, float]:
        """(fixed seconds, seconds per token) a chunk adds to a step; (0, average) until the chunk
        sizes seen vary enough to separate the two."""
        if self._t is None or self.token_s is None:
            return 0.0, self.token_s or 0.0
        variance = self._tt - self._t**2
        if variance < (0.2 * self._t) ** 2:
            return 0.0, self.token_s
        per_token = (self._ts - self._t * self._s) / variance
        # Noise can make the fit nonsense: a token never costs more than the average (which
        # carries the fixed part too), nor less than a hundredth of it.
        per_token = min(self.token_s, max(per_token, self.token_s / 100))
        return max(0.0, self._s - per_token * self._t), per_token

    def observe(self, seconds: float, *, prompt_tokens: int, decoding: bool) -> None:
        """Learn from a step that took ``seconds`` with ``prompt_tokens`` prefilled."""
        if prompt_tokens == 0:
            if decoding:
                self.decode_s = self._mix(self.decode_s, seconds)
            return
        chunk_s = seconds - (self.decode_s or 0.0) if decoding else seconds
        if chunk_s <= 0:
            return
        self.token_s = self._mix(self.token_s, chunk_s / prompt_tokens)
        t = float(prompt_tokens)
        if self._t is None:
            self._t, self._s, self._tt, self._ts = t, chunk_s, t * t, t * chunk_s
        else:
            self._t, self._s = self._mix(self._t, t), self._mix(self._s, chunk_s)
            self._tt, self._ts = self._mix(self._tt, t * t), self._mix(self._ts, t * chunk_s)

    def _mix(self, average: float | None, sample: float) -> float:
        return sample if average is None else (1 - self.weight) * average + self.weight * sample
