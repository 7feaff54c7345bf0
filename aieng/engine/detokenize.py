"""Incremental detokenization: turn a growing list of token ids into text deltas.

Decoding token by token is wrong for byte-level BPE: one character can span several tokens
(multi-byte UTF-8), and a token's text can depend on its left neighbour. So each step decodes a
small window twice — the already-emitted tail, and the tail plus new tokens — and emits only the
difference, holding back while the result ends in an incomplete character (U+FFFD).
Concatenating every delta gives exactly ``tokenizer.decode(all_ids)``.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
WINDOW = 6  # tokens of left context kept to decode merges correctly


class IncrementalDetokenizer:
    def __init__(self, tokenizer, *, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # tokens before this are already emitted as text
        # A fast tokenizer's Rust backend decodes the same text without transformers' per-call
        # Python (argument conversion, clean-up checks): two decodes per token, on every row of
        # every step, add up. Other tokenizers go through ``decode``.
        backend = getattr(tokenizer, "_tokenizer", None)
        self._backend_decode = backend.decode if backend is not None and hasattr(backend, "decode") else None

    def _decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one token; return the new complete text (possibly empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            delta = full[len(prefix):]
            self.read_offset = len(self.ids)
            self.prefix_offset = max(0, self.read_offset - WINDOW)
            return delta
        return ""

    def flush(self) -> str:
        """At the end: whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        self.read_offset = len(self.ids)
        return full[len(prefix):] if len(full) > len(prefix) else ""
