"""The demo tokenizer: byte-level BPE trained on the demo corpus, plus its chat template.

Byte-level means any UTF-8 text encodes (no unknown token), so the server can accept arbitrary
prompts. Digits are split one per token before BPE so that ``27`` and ``72`` share pieces and
addition becomes learnable digit by digit.

The chat template is the single definition of the prompt format: training documents are
rendered through it (:func:`render_documents`) and it is saved in ``tokenizer_config.json``, so
``apply_chat_template`` and ``/v1/chat/completions`` produce exactly what the model was trained
on. Rendered, a conversation looks like::

    <|bos|><|user|>add: 27+58<|end|><|assistant|>85<|end|>
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from aieng.demo.corpus import Example

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|end|>"  # ends every message; the model emitting it ends generation
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SYSTEM = "<|system|>"
#: Fixed ids 0..5, in this order, whatever the corpus (the trainer puts them first).
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, USER, ASSISTANT, SYSTEM)

#: Jinja chat template saved with the tokenizer. Roles map to their special tokens; every
#: message is closed by <|end|>; add_generation_prompt opens the assistant turn. No newlines or
#: spaces are inserted, so the rendered text is exactly what the model saw in training.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('roles must be system, user or assistant, got ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>' + message['content'] + eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)
#: Bump with any change of CHAT_TEMPLATE (recorded in demo_build.json and the manifest).
CHAT_TEMPLATE_VERSION = "demo-chat-v1"


def train_tokenizer(texts: Iterable[str], *, vocab_size: int) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on ``texts`` and wrap it as a transformers fast tokenizer.

    ``texts`` should be rendered documents (special tokens included: they are matched as
    whole added tokens, never merged into BPE pieces). Deterministic for the same texts.
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # Offsets only; adds no tokens: the chat template places <|bos|> itself.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert backend.token_to_id(token) == i, f"special token {token} is not id {i}"
    return wrap_tokenizer(backend)


def wrap_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a trained ``tokenizers.Tokenizer`` with special-token roles and the chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=[USER, ASSISTANT, SYSTEM],
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
        padding_side="left",  # generation pads on the left so new tokens line up
        clean_up_tokenization_spaces=False,
    )


def conversation(example: Example, *, with_answer: bool = True) -> list[dict[str, str]]:
    """The chat messages of one example (the user prompt, and the reply when training)."""
    messages = [{"role": "user", "content": example.prompt}]
    if with_answer:
        messages.append({"role": "assistant", "content": example.answer})
    return messages


def render_documents(
    tokenizer: PreTrainedTokenizerFast, examples: Sequence[Example], *, with_answer: bool = True
) -> list[str]:
    """Render examples through the tokenizer's own chat template (one string per example).

    With ``with_answer=False`` the text ends with the opened assistant turn: the prompt for
    generation, usable as-is for a plain completion request.
    """
    if not examples:
        return []
    return tokenizer.apply_chat_template(
        [conversation(e, with_answer=with_answer) for e in examples],
        tokenize=False,
        add_generation_prompt=not with_answer,
    )
