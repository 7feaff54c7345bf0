"""Chat messages to the prompt a model was trained on: through the tokenizer's own chat template.

One copy, used by the server's chat route, the evaluation suite, the benchmarks, the notebooks and
the tests: a prompt rendered one way in evaluation and another in serving would measure a model
nobody serves.
"""

from __future__ import annotations

from aieng.errors import InvalidRequestError


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_text(tokenizer, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
    """The conversation as text; with ``add_generation_prompt`` it ends with the assistant turn opened."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def user_prompt(tokenizer, text: str) -> str:
    """One user message, ready for the reply; the plain text for a model without a chat template."""
    if not has_chat_template(tokenizer):
        return text
    return chat_text(tokenizer, [{"role": "user", "content": text}])


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the conversation with the assistant turn opened (``/v1/chat/completions``)."""
    if not has_chat_template(tokenizer):
        raise InvalidRequestError("this model has no chat template; use /v1/completions", param="messages")
    from jinja2 import TemplateError

    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    except TemplateError as exc:
        # A template refusing the conversation (Llama 2's "roles must alternate", a missing user turn)
        # says what is wrong with the request: a 400 with its message, not a 500 with none.
        raise InvalidRequestError(
            f"the model's chat template refused these messages: {exc}", param="messages"
        ) from None
    return list(ids)
