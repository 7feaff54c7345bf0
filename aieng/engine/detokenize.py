"""Incremental detokenization: turn a growing list of token ids into text deltas, in the prompt's context.

A generation's text is the text its tokens add after the prompt's: for prompt ids ``P`` and
generated ids ``G`` (both decoded with ``skip_special_tokens=True``, as the server decodes),

    decode(P) + text == decode(P + G)

whenever the prompt ends where its text is final (see below), streamed or whole. Decoding ``G`` on
its own is not that: SentencePiece's decoder (Llama 2, Mistral) strips the first space of a text,
so a reply whose first token is ``▁Paris`` after "The capital of France is" would read "Paris"
("...isParis"); in the prompt's context it is " Paris", as vLLM and TGI return it. For byte-level
BPE (GPT-2, Llama 3, Qwen, the demo model) the two are the same.

Decoding token by token is wrong too: one character can span several tokens (multi-byte UTF-8),
and a token's text can depend on its left neighbour. So each step decodes a small window twice —
the already-emitted tail (at first the prompt's last ``WINDOW`` tokens), and the tail plus new
tokens — and emits only the difference, holding back while the result ends in an incomplete
character (U+FFFD). Each step decodes O(``WINDOW``) tokens, never the whole prompt. An incomplete
or invalid UTF-8 sequence is never dropped or repaired: it comes out as the tokenizer's own decoder
spells it (U+FFFD), streamed or not.

Decoders that need more than that, all of SentencePiece's as Llama 2 and Mistral ship it:

- ByteFallback decodes a run of ``<0xXX>`` byte tokens as a whole: valid UTF-8 becomes its
  characters, anything else one U+FFFD per byte, so a later byte token can turn a run's
  characters already complete ("中") into U+FFFD. A run's text is therefore held back until a
  token that is not a byte ends it (a skipped special token does not: the decoder never sees it).
- Strip removes the first space of a decoded text, so a window whose emitted tail decodes to
  nothing (special tokens only) would strip a space that belongs to the text. The window then
  reaches further back — into the prompt, as far as it takes — until its tail has text; only a
  text that really starts there (a prompt with no text, or no prompt) loses its first space.

Special tokens the decoder skips are left out of the window altogether (they change no decode),
so a prompt's trailing ``<|eot_id|>``-style tokens cost nothing.

**A prompt whose text is not final.** ``decode(P)`` need not be a prefix of ``decode(P + G)``
when the prompt ends where a later token can still change its text: inside an incomplete UTF-8
character (byte-level BPE; only a prompt given as ids can), or with a byte-fallback token
(SentencePiece spells a rare character or an emoji at the prompt's end in byte tokens, and
ByteFallback decodes a run as a whole: the prompt's valid "龘" followed by a generated stray byte
decodes as four U+FFFD). The equation above may then have no solution, and the prompt's text is
taken as final, as the client has it and as ``echo`` sent it first: the generation's bytes start
a character, or a run, of their own. Precisely: when the prompt's last token the decoder sees is
a byte token, or its tail's text ends in U+FFFD, the detokenizer puts a plain-text token ``a``
(``tokenizer.encode("a")``) between prompt and generation, and

    text == decode(P + [a] + G)[len(decode(P + [a])):]

which still gives ``decode(P) + text == decode(P + G)`` whenever the generation does not continue
the prompt's character or run: its first token the decoder sees is not a byte token
(SentencePiece), its first byte is not a UTF-8 continuation byte (byte-level). For a prompt made
from text (the server's: its characters are whole, its byte runs valid UTF-8) it also holds when
the generation's first run of byte tokens is valid UTF-8 on its own ("龘" then the bytes of "中"
reads "中"); only a generated run that is not ("龘" then a stray byte) differs: it reads one
U+FFFD per stray byte, and the prompt's "龘" stays. A tokenizer without ``encode`` decodes such a
generation without the prompt's context (as ``decode(G)``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

REPLACEMENT = "\ufffd"
WINDOW = 6  # tokens of left context kept to decode merges correctly
_BYTE_PIECES = [f"<0x{byte:02X}>" for byte in range(256)]
_byte_ids_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_facts_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def byte_fallback_ids(tokenizer) -> frozenset[int]:
    """The ids of a SentencePiece vocabulary's 256 byte tokens ``<0x00>``..``<0xFF>``; empty when
    the vocabulary has no such tokens (byte-level BPE spells bytes otherwise). Cached per tokenizer:
    every row of every request asks."""
    try:
        return _byte_ids_cache[tokenizer]
    except (KeyError, TypeError):
        pass
    found: frozenset[int] = frozenset()
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is not None:
        ids = convert(_BYTE_PIECES)
        unknown = getattr(tokenizer, "unk_token_id", None)
        if all(isinstance(i, int) and i != unknown for i in ids) and len(set(ids)) == 256:
            found = frozenset(ids)
    try:
        _byte_ids_cache[tokenizer] = found
    except TypeError:  # not weak-referenceable: computed again next time
        pass
    return found


@dataclass(frozen=True)
class _Facts:
    """What every detokenizer of one tokenizer needs to know, found once (see ``_facts``)."""

    byte_ids: frozenset[int]  # byte-fallback tokens: a run of them decodes as a whole
    dropped: frozenset[int]  # special tokens the decoder skips: left out of every window
    breaker: tuple[int, ...]  # plain-text token(s) closing a prompt whose text is not final; () if none


def _facts(tokenizer, decode, skip_special_tokens: bool) -> _Facts:
    try:
        found = _facts_cache[tokenizer].get(skip_special_tokens)
    except (KeyError, TypeError):
        found = None
    if found is not None:
        return found
    byte_ids = byte_fallback_ids(tokenizer)
    # A special token is left out only where decoding it says nothing: one the decoder would write
    # as text (not marked special in the backend) stays in, so the text is still decode's.
    specials: set[int] = set()
    if skip_special_tokens:
        specials.update(getattr(tokenizer, "all_special_ids", ()))
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}  # <|eot_id|>-style tokens, reserved ones
        specials.update(i for i, token in added.items() if getattr(token, "special", False))
    dropped = frozenset(i for i in specials if decode([i]) == "")
    breaker: tuple[int, ...] = ()
    try:
        candidate = tuple(tokenizer.encode("a", add_special_tokens=False))
        text = decode(list(candidate))
        if candidate and text and REPLACEMENT not in text and not any(i in byte_ids or i in dropped for i in candidate):
            breaker = candidate
    except Exception:  # noqa: BLE001 - a tokenizer without encode: no breaker (see the module doc)
        pass
    found = _Facts(byte_ids, dropped, breaker)
    try:
        _facts_cache.setdefault(tokenizer, {})[skip_special_tokens] = found
    except TypeError:  # not weak-referenceable: computed again next time
        pass
    return found


class IncrementalDetokenizer:
    """One generation's text, delta by delta, in the context of its prompt (see the module doc).

    ``prompt_ids``: the prompt the generation follows; empty for a text of its own (which is then
    ``decode(G)``). Only its tail is read, ``WINDOW`` decoded tokens at first, further back only
    while that tail has no text."""

    def __init__(self, tokenizer, *, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # A fast tokenizer's Rust backend decodes the same text without transformers' per-call
        # Python (argument conversion, clean-up checks): two decodes per token, on every row of
        # every step, add up. Other tokenizers go through ``decode``.
        backend = getattr(tokenizer, "_tokenizer", None)
        self._backend_decode = backend.decode if backend is not None and hasattr(backend, "decode") else None
        facts = _facts(tokenizer, self._decode, skip_special_tokens)
        self._byte_ids, self._dropped = facts.byte_ids, facts.dropped
        self.ids: list[int] = []  # the window's material: the prompt's tail read so far, then the generated ids
        self._prompt = prompt_ids
        self._prompt_left = len(prompt_ids)  # prompt tokens before this index are not in ``ids`` (yet)
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # tokens before this are already emitted as text (or are the prompt's)
        self._take_prompt(WINDOW)
        self._open_run = bool(self.ids) and self.ids[-1] in self._byte_ids  # the prompt's run may go on
        if self.ids and (self._open_run or self._decode(self.ids).endswith(REPLACEMENT)):
            # The prompt's text is not final (module doc): close it with a plain-text token or,
            # for a tokenizer without one, decode the generation without the prompt.
            if facts.breaker:
                self.ids += facts.breaker
            else:
                self.ids, self._prompt_left = [], 0
            self._open_run = False
        self.prefix_offset, self.read_offset = 0, len(self.ids)

    def _take_prompt(self, count: int) -> None:
        """Put up to ``count`` more of the prompt's decoded tokens (going back) before the window."""
        taken, i = [], self._prompt_left
        while i > 0 and len(taken) < count:
            i -= 1
            if self._prompt[i] not in self._dropped:
                taken.append(self._prompt[i])
        self._prompt_left = i
        if taken:
            taken.reverse()
            self.ids[:0] = taken
            self.prefix_offset += len(taken)
            self.read_offset += len(taken)

    def _decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def _window(self) -> tuple[str, str]:
        """The emitted tail's text and the tail-plus-new-tokens' text, over a window whose tail has
        text (see the module doc: a decoder may treat the start of a text specially). Reaching back
        doubles the window each time, into the prompt when the window's start is reached."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        while not prefix:
            step = max(WINDOW, self.read_offset - self.prefix_offset)
            if self.prefix_offset < step and self._prompt_left:
                self._take_prompt(step)
            if self.prefix_offset == 0:
                break
            self.prefix_offset = max(0, self.prefix_offset - step)
            prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        return prefix, self._decode(self.ids[self.prefix_offset :])

    def add(self, token_id: int) -> str:
        """Append one generated token; return the new complete text (possibly empty)."""
        if token_id in self._dropped:  # the decoder never sees it: no text, and a byte run goes on
            return ""
        self.ids.append(token_id)
        self._open_run = token_id in self._byte_ids
        if self._open_run:  # the run's text is not final until a token that is not a byte ends it
            return ""
        prefix, full = self._window()
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            delta = full[len(prefix) :]
            self.read_offset = len(self.ids)
            self.prefix_offset = max(0, self.read_offset - WINDOW)
            return delta
        return ""

    def flush(self) -> str:
        """At the end: whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix, full = self._window()
        self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
