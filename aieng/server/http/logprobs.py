"""The engine's per-token logprobs in OpenAI's two shapes.

- Completions (the legacy shape): parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs``
  (one ``{token: logprob}`` dict per token) and ``text_offset`` (where each token's text starts in
  the choice's text).
- Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}]}``.

A stream sends, with each chunk, the logprobs of the tokens since the previous chunk (a token whose
text is held back, say a possible stop string, is sent with the chunk that releases it).

``text_offset`` is where a token's text starts in the choice's text, read off the same incremental
detokenizer that makes the text (``TextOffsets``), not summed from the tokens' own texts: those
are U+FFFD for each piece of a split character, and a special token (``<s>``) has a text that the
choice's text leaves out. The choice's text is decoded in its prompt's context (``▁Paris`` after
a prompt reads " Paris", its own token text, at the text's start); with ``echo`` the generated
tokens' offsets start after the prompt's text. A token whose text is not whole on its own (a
piece of a split character, a byte token) points at where the text it helps make starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from aieng.engine.detokenize import IncrementalDetokenizer
from aieng.engine.sampling import TokenLogprobs
from aieng.engine.token_text import TokenTexts


class TextOffsets:
    """Each next token's ``text_offset``, counted from ``start``: where the text the token releases
    ends with the token's own text, that text's start; otherwise (nothing released, or the token
    only completes text held back for it) the end of what was released before it. ``prompt_ids``:
    the prompt the tokens follow, so that the text is the choice's own (decoded in the prompt's
    context, as the engine decodes it: ``detokenize``)."""

    def __init__(self, texts: TokenTexts, start: int = 0, *, prompt_ids: Sequence[int] = ()):
        self._texts = texts
        self._detokenizer = IncrementalDetokenizer(texts.tokenizer, prompt_ids=prompt_ids)
        self.at = start

    def __call__(self, token_id: int) -> int:
        before = self.at
        released = self._detokenizer.add(token_id)
        self.at += len(released)
        own = self._texts(token_id)[0]
        if own and "\ufffd" not in own and released.endswith(own):
            return self.at - len(own)
        return before


def chat_logprobs(items: Sequence[TokenLogprobs], texts: TokenTexts) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text, raw = texts(token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}

    return {
        "content": [
            {
                **entry(item.token_id, item.logprob),
                "top_logprobs": [entry(token_id, logprob) for token_id, logprob in item.top],
            }
            for item in items
        ]
    }


def completion_logprobs(
    items: Sequence[TokenLogprobs],
    texts: TokenTexts,
    offsets: TextOffsets | None = None,
    *,
    prompt: Sequence[int] = (),
    prompt_items: Sequence[TokenLogprobs | None] = (),
) -> dict:
    """``offsets``: the generated tokens' text offsets, carried from chunk to chunk of a stream,
    started after an echoed prompt and in the prompt's context (a fresh one from 0, without
    context, when None). ``prompt`` / ``prompt_items``:
    an echoed prompt's token ids and their logprobs, listed first (the first token has none: null,
    as OpenAI sends it), their offsets from 0.

    ``top_logprobs`` is keyed by token text, and texts can repeat (every lone byte of a split
    character is U+FFFD): the most likely token of a text keeps its key."""
    tokens, starts, values, tops = [], [], [], []
    prompt_offsets = TextOffsets(texts)
    offsets = offsets if offsets is not None else TextOffsets(texts)
    entries = [(token_id, item, prompt_offsets) for token_id, item in zip(prompt, prompt_items)]
    entries += [(item.token_id, item, offsets) for item in items]
    for token_id, item, offset in entries:
        tokens.append(texts(token_id)[0])
        starts.append(offset(token_id))
        values.append(item.logprob if item is not None else None)
        top = None
        if item is not None:
            top = {}
            for t, logprob in sorted(item.top, key=lambda pair: -pair[1]):
                top.setdefault(texts(t)[0], logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": starts}
