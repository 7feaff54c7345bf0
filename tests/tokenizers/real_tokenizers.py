"""Tokenizers shaped like the ones users bring, built offline in seconds, and tiny models that use them.

Every other test serves the demo's few-hundred-token byte-level BPE, whose corpus is ASCII task
prompts: what streaming, stop strings and logprobs do with a real model's vocabulary (tens of
thousands of tokens, Chinese, emoji, SentencePiece's "▁" and byte fallback) was never exercised.
Downloading real tokenizers is not an option (tests run offline), so this module trains two with
the ``tokenizers`` library on a generated corpus, in the two families that cover what is served:

- ``byte_level``: byte-level BPE like GPT-2, Llama 3 and Qwen (the same pre-tokenizer regex as
  Llama 3), at least 32k tokens. Common CJK characters are whole tokens; rarer ones (CJK
  extensions A and B) and many emoji split into byte pieces, so one character spans tokens.
- ``sentencepiece``: a Llama 2 / Mistral ``tokenizer.json``: BPE with ``byte_fallback``, the
  ``<0x00>``..``<0xFF>`` tokens at ids 3..258, the Metaspace "▁" pre-tokenizer and the decoder
  those models ship (Replace "▁" → " ", ByteFallback, Fuse, Strip one leading space). Its
  alphabet is the corpus's common characters only: rare Chinese characters and every emoji come
  out as byte tokens.

Each gets the special tokens and a Jinja chat template with a system prompt in the style of its
family (Llama 3's header tokens with a default system message; Llama 2's ``[INST] <<SYS>>``), and
``model_folder`` writes a random-weight Llama with that vocabulary as a Hugging Face folder, so
it registers in the store and serves like any model. The weights are noise; the model emits
arbitrary tokens, byte tokens and split characters included, which is the point.

Everything is seeded: the same code gives the same tokenizer and weights on every machine.
This lives with the tests, not in ``aieng.demo``: it is a fixture for proving text handling, its
outputs are meaningless, and the demo's stand-in shapes keep the demo tokenizer on purpose.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = Path(__file__).resolve().parent
ZH_SENTENCES = [line for line in (HERE / "corpus_zh.txt").read_text(encoding="utf-8").splitlines() if line]

# Llama 3's pre-tokenizer split (tokenizer.json of Meta-Llama-3-8B), before the byte-level mapping.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

EMOJI = [
    "😀",
    "😂",
    "🥲",
    "🚀",
    "🔥",
    "🎉",
    "❤️",
    "👍",
    "👍🏽",
    "🙏🏿",
    "✨",
    "🌧️",
    "1️⃣",
    "👩‍💻",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🧑🏻‍🚀",
    "🇫🇷",
    "🇯🇵",
    "🇨🇳",
    "🇧🇷",
]
#: CJK the SentencePiece tokenizer knows besides the sentences' characters: the start of the
#: unified block. Everything else in CJK (and every emoji) is byte fallback there.
SP_CJK_BAND = (0x4E00, 0x4FFF)

BYTE_LEVEL_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama 3's template, cut to what a text model uses: a default system message when none is given.
BYTE_LEVEL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = 'You are a helpful assistant. 你是一个乐于助人的助手。' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Llama 2 chat's template as Meta's tokenizer_config.json ships it.
SENTENCEPIECE_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

_SYLLABLES = [
    "ka",
    "ro",
    "mi",
    "tan",
    "sel",
    "vo",
    "qu",
    "ith",
    "ber",
    "lo",
    "nex",
    "dra",
    "pli",
    "shu",
    "gor",
    "ten",
    "wa",
    "zel",
    "fi",
    "mon",
    "ark",
    "ul",
    "pre",
    "sto",
    "cha",
    "den",
    "ix",
    "om",
    "bre",
    "yu",
]
_ENGLISH = (
    "the of and to in is that for it as with was on be by this are from at or an have not but which "
    "server token stream model text request reply answer river stone apple moon light water code test "
    "value number string return list print function class import error result data time first last"
).split()


@functools.lru_cache(maxsize=2)
def corpus(seed: int = 0) -> tuple[str, ...]:
    """Lines of mixed text: real Chinese sentences, every CJK unified ideograph at least a few times,
    emoji (ZWJ sequences, skin tones, flags), English-like words, numbers and code."""
    rng = random.Random(seed)
    lines = [s for s in ZH_SENTENCES for _ in range(20)]
    cjk = [chr(c) for c in range(0x4E00, 0xA000)]
    for _ in range(4):  # each basic CJK character in several lines, so its byte pieces merge
        rng.shuffle(cjk)
        lines += ["".join(cjk[i : i + 24]) + "。" for i in range(0, len(cjk), 24)]
    pairs = [rng.choice(cjk) + rng.choice(cjk) for _ in range(3000)]  # two-character words, as real vocabularies have
    lines += ["，".join(pairs[i : i + 10]) + "。" for _ in range(3) for i in range(0, len(pairs), 10)]
    common = sorted({ch for s in ZH_SENTENCES for ch in s})
    for _ in range(3000):  # frequent characters in word-like pairs, so multi-character tokens exist too
        lines.append("".join(rng.choice(common) + rng.choice(common) for _ in range(rng.randint(3, 10))) + "，")
    words = _ENGLISH + ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(20000)]
    cumulative = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))  # Zipf-like
    for _ in range(20000):
        sentence = " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(4, 14)))
        lines.append(sentence.capitalize() + rng.choice([".", "!", "?", ",", ":"]) + f" {rng.randint(0, 99999)}")
    for _ in range(2500):
        name, other = rng.choice(words), rng.choice(words)
        lines.append(
            rng.choice(
                [
                    f"def {name}_{other}(x, y=None):\n    return x + {rng.randint(0, 999)}  # {name}\n",
                    f"const {name} = ({other}) => {{ return {other}.map(v => v * {rng.randint(2, 9)}); }};",
                    f'if {name} is not None and len({other}) > {rng.randint(0, 99)}:\n\tprint(f"{{{name}!r}}")',
                    f"for (int i = 0; i < {rng.randint(1, 64)}; ++i) {{ {name}[i] = {other}(i); }}",
                ]
            )
        )
    lines += [f"{n}, {n * 7 % 1000}; {n:x}" for n in range(1000) for _ in range(2)]  # numbers and hex
    for _ in range(3000):
        picked = rng.choices(EMOJI, k=rng.randint(1, 4))
        lines.append(rng.choice(words) + " " + "".join(picked) + " " + rng.choice(common) * rng.randint(1, 2))
    rng.shuffle(lines)
    return tuple(lines)


def byte_level_tokenizer(*, vocab_size: int = 40000, seed: int = 0):
    """A Llama 3-style byte-level BPE (at least 32k tokens), wrapped for transformers."""
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=16,
    )
    backend.train_from_iterator(corpus(seed), trainer=trainer)
    backend.add_special_tokens(BYTE_LEVEL_SPECIALS)
    bos = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.Sequence(
        [  # like Llama 3: the prompt starts with <|begin_of_text|>
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        chat_template=BYTE_LEVEL_TEMPLATE,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def sentencepiece_tokenizer(*, vocab_size: int = 32000, seed: int = 0):
    """A Llama 2 / Mistral-style tokenizer.json: "▁" BPE with byte fallback, wrapped for transformers."""
    from transformers import PreTrainedTokenizerFast

    known = {chr(c) for c in range(*SP_CJK_BAND)} | {ch for s in ZH_SENTENCES for ch in s}
    keep = lambda ch: ord(ch) < 0x2E80 or ch in known  # noqa: E731 - Latin, punctuation; known CJK only
    texts = ["".join(ch for ch in line if keep(ch)) for line in corpus(seed)]
    # Trained split at every "▁" so no piece crosses a word (SentencePiece's pieces never do); served
    # unsplit, as Llama 2's and Mistral's tokenizer.json are.
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    # Trained with the specials and byte tokens as the first ids (as SentencePiece orders them), then
    # rebuilt with byte_fallback: the trainer knows no byte fallback of its own.
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=specials + byte_tokens,
        max_token_length=16,
    )
    trained.train_from_iterator(texts, trainer=trainer)
    spec = json.loads(trained.to_str())
    vocab, merges = (
        spec["model"]["vocab"],
        [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]],
    )
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens(specials)  # only these: the byte tokens stay ordinary vocabulary
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    for i, token in enumerate(specials + byte_tokens):
        if backend.token_to_id(token) != i:
            raise RuntimeError(f"{token} got id {backend.token_to_id(token)}, expected {i}")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=SENTENCEPIECE_TEMPLATE,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def model_folder(
    tokenizer,
    out_dir: Path,
    *,
    seed: int = 0,
    eos_ids: list[int] | None = None,
    favour: range | None = None,
    factor: float = 1.4,
) -> Path:
    """A tiny random Llama with ``tokenizer``'s vocabulary, written as a Hugging Face folder.

    Untied, wide-initialised weights: a tied or small-initialised random model greedily repeats
    one token, and the tests want it to wander over the vocabulary. ``favour``: token ids whose
    output rows are scaled by ``factor`` so greedy decoding picks them often (the byte tokens of
    a byte-fallback vocabulary, a few hundred of tens of thousands, would otherwise hardly ever
    come out, and partial UTF-8 is what the tests are about)."""
    import torch

    from aieng.demo.model import ModelDims, generation_config, llama_config, new_model
    from aieng.demo.tokenizer import save_tokenizer

    dims = ModelDims(
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        context_length=512,
        initializer_range=0.5,
        tie_word_embeddings=False,
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = {"bos_id": tokenizer.bos_token_id, "eos_id": tokenizer.eos_token_id, "pad_id": pad}
    config = llama_config(dims, vocab_size=len(tokenizer), **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = new_model(config).eval()
    if favour is not None:
        with torch.no_grad():
            model.lm_head.weight[favour.start : favour.stop] *= factor
    model.generation_config = generation_config(**ids)
    if eos_ids:
        model.generation_config.eos_token_id = eos_ids
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    return out_dir


_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def prompt_is_final(tokenizer, prompt: Sequence[int]) -> bool:
    """No generation can change the prompt's text: it ends neither inside a character (its text
    ends in U+FFFD) nor with a byte-fallback token (special tokens aside: the decoder skips them)."""
    seen = [i for i in prompt if i not in tokenizer.all_special_ids]
    if seen and _BYTE_PIECE.fullmatch(tokenizer.convert_ids_to_tokens(seen[-1])):
        return False
    return not tokenizer.decode(list(prompt), skip_special_tokens=True).endswith("\ufffd")


def _first_byte(tokenizer, token_id: int) -> int | None:
    """The first byte a token writes, where the vocabulary spells bytes (byte-level or byte tokens)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    piece = tokenizer.convert_ids_to_tokens(token_id)
    if _BYTE_PIECE.fullmatch(piece):
        return int(piece[3:5], 16)
    if type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel" and piece:
        return {char: byte for byte, char in bytes_to_unicode().items()}.get(piece[0])
    return None


def generated_text(tokenizer, prompt: Sequence[int], ids: Sequence[int]) -> str:
    """What aieng must say a generation ``ids`` after ``prompt`` reads, from whole decodes (the
    rule in ``aieng.engine.detokenize``): the text the ids add after the prompt's, so that
    ``decode(prompt) + text == decode(prompt + ids)``; for a prompt whose text is not final, what
    they add after the prompt closed by a plain token ``a``, which is still that whenever the
    generation does not continue the prompt's character or byte run."""

    def decode(some):
        return tokenizer.decode(list(some), skip_special_tokens=True)

    head, whole = decode(prompt), decode([*prompt, *ids])
    if prompt_is_final(tokenizer, prompt):
        assert whole.startswith(head), (prompt, ids)
        return whole[len(head) :]
    closed = [*prompt, *tokenizer.encode("a", add_special_tokens=False)]
    text = decode([*closed, *ids])[len(decode(closed)) :]
    seen = [i for i in ids if i not in tokenizer.all_special_ids]
    if seen:
        first = _first_byte(tokenizer, seen[0])
        byte_token = bool(_BYTE_PIECE.fullmatch(tokenizer.convert_ids_to_tokens(seen[0])))
        if not byte_token and not (first is not None and 0x80 <= first < 0xC0):  # a new character, a new run
            assert head + text == whole, (prompt, ids)
    return text


def build(kind: str, out_dir: Path) -> Path:
    """The tokenizer ``kind`` (``byte_level`` or ``sentencepiece``) and its random model in ``out_dir``."""
    if kind == "byte_level":
        tokenizer = byte_level_tokenizer()
        ends = [tokenizer.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|end_of_text|>")]  # as Llama 3 Instruct
        return model_folder(tokenizer, out_dir, eos_ids=ends)
    if kind == "sentencepiece":
        return model_folder(sentencepiece_tokenizer(), out_dir, favour=range(3, 259))
    raise ValueError(f"unknown tokenizer kind {kind!r}")
