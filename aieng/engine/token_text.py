"""One token's own text and bytes, for logprobs (OpenAI's ``token`` and ``bytes`` fields).

A token is not always whole text: byte-level BPE (GPT-2, Llama 3, SmolLM, the demo model) splits a
multi-byte character across tokens, and SentencePiece falls back to ``<0xE2>``-style byte tokens.
``decode([id])`` then gives U+FFFD, which is why OpenAI sends ``bytes`` beside ``token``: a client
joins the bytes of consecutive tokens to rebuild the text. The bytes here are exact for both kinds
of tokenizer and the decoded text's UTF-8 otherwise. Lookups are cached per id: a stream with
``top_logprobs: 20`` asks for 21 tokens per step, most of them the same few.

A token's text is the text it adds inside a text, not ``decode([id])`` alone: SentencePiece's
decoder (Llama 2, Mistral) strips the first space of a decoded text, so ``▁world`` alone decodes
to ``world`` although it writes `` world`` after any other token. Each token is decoded after a
fixed anchor token and the anchor's text cut off, which gives every tokenizer's in-text spelling
without knowing its decoder.
"""

from __future__ import annotations

import re

from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte <-> printable char table

_BYTE_OF_CHAR = {char: byte for byte, char in bytes_to_unicode().items()}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTexts:
    """``tokenizer``'s token ids → (text, bytes), cached. Thread-safe enough: a race fills one entry twice."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        try:  # a plain letter's token(s): whole text, and nothing a following token can change
            self._anchor = list(tokenizer.encode("a", add_special_tokens=False))
        except Exception:  # noqa: BLE001 - a tokenizer without encode: decode tokens alone
            self._anchor = []
        self._anchor_text = tokenizer.decode(self._anchor) if self._anchor else ""

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._lookup(token_id)
        return found

    def _text(self, token_id: int) -> str:
        if self._anchor:
            after = self.tokenizer.decode([*self._anchor, token_id])
            if after.startswith(self._anchor_text):
                return after[len(self._anchor_text) :]
        return self.tokenizer.decode([token_id])

    def _lookup(self, token_id: int) -> tuple[str, list[int]]:
        text = self._text(token_id)
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            byte = _BYTE_TOKEN.fullmatch(piece)
            if byte:  # SentencePiece byte fallback
                return text, [int(byte.group(1), 16)]
            if "\ufffd" in text and piece and all(char in _BYTE_OF_CHAR for char in piece):  # byte-level BPE
                return text, [_BYTE_OF_CHAR[char] for char in piece]
        return text, list(text.encode("utf-8"))
