"""The demo tokenizer: byte-level BPE trained on the demo corpus, plus its chat template.

Byte-level means any UTF-8 text encodes (no unknown token), so the server can accept arbitrary
prompts. Digits are split one per token before BPE so that ``27`` and ``72`` share pieces and
addition becomes learnable digit by digit.

The chat template is the single definition of the prompt format: training documents are
rendered through it (:func:`render_documents`) and it is saved in ``tokenizer_config.json``, so
``apply_chat_template`` and ``/v1/chat/completions`` produce exactly what the model was trained
on. Rendered, a conversation looks like (the system turn is optional)::

    <|bos|><|system|>Be brief.<|end|><|user|>add: 27+58<|end|><|assistant|>85<|end|>

and a generation prompt ends with the opened assistant turn: ``...<|end|><|assistant|>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

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

    ``texts`` are message contents (prompts, answers, system messages); the special tokens get
    the fixed ids 0..5 and are only ever matched whole, never merged into BPE pieces.
    ``vocab_size`` is an upper bound: on a repetitive corpus merges run out before it.
    Deterministic for the same texts.
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
        if backend.token_to_id(token) != i:
            raise RuntimeError(f"special token {token} got id {backend.token_to_id(token)}, expected {i}")
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
    """The chat messages of one example: [system,] user [, assistant when training]."""
    messages = []
    if example.system is not None:
        messages.append({"role": "system", "content": example.system})
    messages.append({"role": "user", "content": example.prompt})
    if with_answer:
        messages.append({"role": "assistant", "content": example.answer})
    return messages


_HOLES = ("\x00SYSTEM\x00", "\x00PROMPT\x00", "\x00ANSWER\x00")


def _skeleton(tokenizer: PreTrainedTokenizerFast, *, with_system: bool, with_answer: bool) -> list[str]:
    """The template rendered around placeholder contents, cut into the literal pieces between them."""
    holder = Example(family="", system=_HOLES[0] if with_system else None, prompt=_HOLES[1], answer=_HOLES[2])
    text = tokenizer.apply_chat_template(
        conversation(holder, with_answer=with_answer), tokenize=False, add_generation_prompt=not with_answer
    )
    used = [h for h, on in zip(_HOLES, (with_system, True, with_answer)) if on]
    pieces = []
    for hole in used:
        if text.count(hole) != 1:
            raise ValueError("the chat template does not place each message content exactly once")
        before, text = text.split(hole)
        pieces.append(before)
    pieces.append(text)
    return pieces


def render_documents(
    tokenizer: PreTrainedTokenizerFast, examples: Sequence[Example], *, with_answer: bool = True
) -> list[str]:
    """Render examples through the tokenizer's own chat template (one string per example).

    With ``with_answer=False`` the text ends with the opened assistant turn: the prompt for
    generation, usable as-is for a plain completion request.

    The template is rendered once with placeholder contents and the placeholders are then
    filled per example (a build renders every training document, and apply_chat_template's
    per-call Python would be a visible share of the build). A spot check renders some examples
    the slow way and insists on equality, so
    a template that transforms content (trimming, escaping) fails loudly instead of silently
    training on a different format.
    """
    if not examples:
        return []
    skeletons = {
        with_system: _skeleton(tokenizer, with_system=with_system, with_answer=with_answer)
        for with_system in (False, True)
    }
    rendered = []
    for e in examples:
        pieces = skeletons[e.system is not None]
        contents = ([e.system] if e.system is not None else []) + [e.prompt] + ([e.answer] if with_answer else [])
        rendered.append("".join(p + c for p, c in zip(pieces, contents)) + pieces[-1])
    with_system = [i for i, e in enumerate(examples) if e.system is not None][:8]
    check = sorted(set(range(min(8, len(examples)))) | set(with_system))
    slow = tokenizer.apply_chat_template(
        [conversation(examples[i], with_answer=with_answer) for i in check],
        tokenize=False,
        add_generation_prompt=not with_answer,
    )
    if slow != [rendered[i] for i in check]:
        raise ValueError("the chat template renders contents non-verbatim; cannot use the fast path")
    return rendered


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of rendered documents, special tokens matched in the text and none added.

    Goes straight to the Rust tokenizer's batch encoder (the transformers wrapper adds Python
    work per document, and a build encodes every training document).
    """
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # _fast: no offsets
    return [enc.ids for enc in encode(list(texts), add_special_tokens=False)]


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (chat template inside) to ``directory``.

    ``save_jinja_files=False`` keeps the chat template in tokenizer_config.json rather than a
    separate chat_template.jinja, where every version of every tool looks for it. The class is
    recorded as ``PreTrainedTokenizerFast``: transformers 5 would write its internal name
    ``TokenizersBackend``, which older releases do not know, and loads either name the same.
    """
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
