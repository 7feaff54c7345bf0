"""The engine's per-token logprobs in OpenAI's two shapes.

- Completions (the legacy shape): parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs``
  (one ``{token: logprob}`` dict per token) and ``text_offset`` (where each token's text starts in
  the choice's text).
- Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}]}``.

A stream sends, with each chunk, the logprobs of the tokens since the previous chunk (a token whose
text is held back, say a possible stop string, is sent with the chunk that releases it).
"""

from __future__ import annotations

from collections.abc import Sequence

from aieng.engine.sampling import TokenLogprobs
from aieng.engine.token_text import TokenTexts


def chat_logprobs(items: Sequence[TokenLogprobs], texts: TokenTexts) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text, raw = texts(token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}

    return {"content": [{**entry(item.token_id, item.logprob),
                         "top_logprobs": [entry(token_id, logprob) for token_id, logprob in item.top]}
                        for item in items]}


def completion_logprobs(items: Sequence[TokenLogprobs], texts: TokenTexts, *, offset: int = 0,
                        prompt: Sequence[int] = (), prompt_items: Sequence[TokenLogprobs | None] = ()) -> dict:
    """``offset``: where the first token's text starts in the choice's text (after an echoed prompt,
    or after the text already streamed). ``prompt`` / ``prompt_items``: an echoed prompt's token
    ids and their logprobs, listed first (the first token has none: null, as OpenAI sends it)."""
    tokens, offsets, values, tops = [], [], [], []
    entries = [(token_id, item) for token_id, item in zip(prompt, prompt_items)] + [(i.token_id, i) for i in items]
    if prompt:
        offset = 0
    for token_id, item in entries:
        text = texts(token_id)[0]
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        values.append(item.logprob if item is not None else None)
        tops.append({texts(t)[0]: logprob for t, logprob in item.top} if item is not None else None)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
