"""The text machinery on real-shaped tokenizers, in process: incremental detokenization, token texts.

The HTTP tests see what a random model happens to emit; these build the hard sequences on
purpose (a valid byte run that a stray byte turns invalid, special tokens before a "▁" token,
a prompt that ends inside a character or a byte run, every vocabulary entry's in-text spelling)
so each case is covered whatever the weights do.

A generation's text is what its tokens add after its prompt: ``decode(P) + text == decode(P + G)``
for a prompt ``P`` whose text is final; for one that ends inside a character or a byte run, the
prompt's text stands and ``text == decode(P + [a] + G)[len(decode(P + [a])):]`` (``detokenize``).
"""

from __future__ import annotations

import random

import pytest
from real_tokenizers import generated_text, prompt_is_final

from aieng.engine.detokenize import WINDOW, IncrementalDetokenizer
from aieng.engine.token_text import TokenTexts

KINDS = ("byte_level", "sentencepiece")
TEXTS = [
    "北京是中华人民共和国的首都。龘𠀀𪚥",
    "👨‍👩‍👧‍👦 🇫🇷 👍🏽 ❤️ 1️⃣ 🏳️‍🌈 🧑🏻‍🚀",
    "def 你好(x):\n\treturn x + '🚀'  # 长江 river",
    "spaces:  two,   three, a tab\t and <0xE4> literally",
]


def streamed(tokenizer, ids, prompt=()) -> tuple[str, list[str]]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=prompt)
    deltas = [detokenizer.add(i) for i in ids] + [detokenizer.flush()]
    return "".join(deltas), deltas


def sp_byte(tokenizer, byte: int) -> int:
    return tokenizer.convert_tokens_to_ids(f"<0x{byte:02X}>")


def decode(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", TEXTS)
def test_encoded_text_streams_back_exactly(real_tokenizer, kind, text):
    tokenizer = real_tokenizer(kind)
    ids = tokenizer(text)["input_ids"]
    joined, deltas = streamed(tokenizer, ids)
    assert joined == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("kind", KINDS)
def test_random_token_sequences_stream_exactly_their_decode(real_tokenizer, kind):
    """Arbitrary ids, as a random model emits them: byte pieces, special tokens, split characters.
    Whatever the decode says (U+FFFD included), the deltas say the same."""
    tokenizer = real_tokenizer(kind)
    rng = random.Random(7)
    small = list(range(3, 259)) if kind == "sentencepiece" else list(range(400))  # byte tokens, byte pieces
    for _ in range(300):
        ids = [
            rng.choice(small) if rng.random() < 0.5 else rng.randrange(len(tokenizer))
            for _ in range(rng.randint(1, 40))
        ]
        assert streamed(tokenizer, ids)[0] == tokenizer.decode(ids, skip_special_tokens=True), ids


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", TEXTS + ["The capital of France is Paris"])
def test_a_text_cut_at_any_token_reads_on_from_its_prompt(real_tokenizer, kind, text):
    """Chinese, emoji, mixed: cut the text's ids anywhere into a prompt and a generation; the
    generation's text is the rest of the text wherever the prompt's text is final, and what the
    module doc says where it is not (a cut inside a character or a byte run)."""
    tokenizer = real_tokenizer(kind)
    ids = tokenizer(text)["input_ids"]
    cut_open = 0
    for k in range(1, len(ids)):
        prompt, generated = ids[:k], ids[k:]
        joined, deltas = streamed(tokenizer, generated, prompt)
        assert joined == generated_text(tokenizer, prompt, generated), (k, deltas)
        if prompt_is_final(tokenizer, prompt):
            assert decode(tokenizer, prompt) + joined == text
        else:
            cut_open += 1
    if any("\ufffd" in tokenizer.decode([i]) for i in ids):  # split characters: some cuts fall inside one
        assert cut_open > 0


@pytest.mark.parametrize("kind", KINDS)
def test_random_generations_after_random_prompts(real_tokenizer, kind):
    """Arbitrary prompt and generated ids, as a random model and a prompt of ids make them: byte
    pieces, special tokens, split characters on either side of the boundary."""
    tokenizer = real_tokenizer(kind)
    rng = random.Random(11)
    small = list(range(3, 259)) if kind == "sentencepiece" else list(range(400))
    specials = sorted(tokenizer.all_special_ids)
    counts = {True: 0, False: 0}

    def pick():
        roll = rng.random()
        if roll < 0.45:
            return rng.choice(small)
        return rng.choice(specials) if roll < 0.55 else rng.randrange(len(tokenizer))

    for _ in range(300):
        prompt = [pick() for _ in range(rng.randint(0, 20))]
        generated = [pick() for _ in range(rng.randint(1, 30))]
        expected = generated_text(tokenizer, prompt, generated)
        assert streamed(tokenizer, generated, prompt)[0] == expected, (prompt, generated)
        counts[prompt_is_final(tokenizer, prompt)] += 1
    assert min(counts.values()) > 20  # both kinds of prompt came up


def test_a_prompt_ending_in_a_byte_run_keeps_its_text(real_tokenizer):
    """SentencePiece spells a rare character at the prompt's end ("龘") in byte tokens: a generation
    that continues with valid bytes reads on ("中", decode(P) + text == decode(P + G)); one whose
    first bytes are not valid UTF-8 would turn "龘" into U+FFFD in decode(P + G), and instead reads
    one U+FFFD per stray byte after the prompt's text, which stands."""
    tokenizer = real_tokenizer("sentencepiece")
    prompt = tokenizer("北京龘")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(prompt)[-3:] == ["<0xE9>", "<0xBE>", "<0x98>"]
    word = tokenizer.convert_tokens_to_ids("▁the")
    zhong = [sp_byte(tokenizer, b) for b in "中".encode()]
    for generated, text in (
        ([word], " the"),
        ([*zhong, word], "中 the"),
        ([*zhong], "中"),
        ([tokenizer.bos_token_id, *zhong, word], "中 the"),
    ):
        assert streamed(tokenizer, generated, prompt)[0] == text
        assert decode(tokenizer, prompt) + text == decode(tokenizer, prompt + generated) == "北京龘" + text
    stray = [sp_byte(tokenizer, 0xE4), word]
    assert decode(tokenizer, prompt + stray) == "北京" + "\ufffd" * 4 + " the"  # the decoder's own reading
    assert streamed(tokenizer, stray, prompt)[0] == "\ufffd the"
    assert streamed(tokenizer, stray[:1], prompt)[0] == "\ufffd"  # flushed at the end


def test_a_prompt_ending_inside_a_character_keeps_its_text(real_tokenizer):
    """Byte-level BPE splits "𠀀" into byte pieces; a prompt of ids cut inside it decodes with a
    U+FFFD there. The generation's pieces that would complete the character start one of their
    own (U+FFFD); a generation that starts a new character reads on exactly."""
    tokenizer = real_tokenizer("byte_level")
    ids = tokenizer("北京𠀀 ok")["input_ids"]
    pieces = [i for i, t in enumerate(tokenizer.convert_ids_to_tokens(ids)) if "\ufffd" in tokenizer.decode([ids[i]])]
    assert len(pieces) >= 2
    prompt, generated = ids[: pieces[1]], ids[pieces[1] :]
    assert decode(tokenizer, prompt) == "北京\ufffd"
    text = streamed(tokenizer, generated, prompt)[0]
    assert text.startswith("\ufffd") and text.endswith(" ok") and "𠀀" not in text
    assert text == generated_text(tokenizer, prompt, generated)
    fresh = tokenizer.encode("中 ok", add_special_tokens=False)
    assert decode(tokenizer, prompt) + streamed(tokenizer, fresh, prompt)[0] == decode(tokenizer, prompt + fresh)


@pytest.mark.parametrize("kind", KINDS)
def test_the_detokenizer_decodes_a_window_never_the_prompt(real_tokenizer, kind, monkeypatch):
    """Per token, on the engine thread: a long prompt (a chat's, special tokens included) is read
    through its last few tokens only, however long it is."""
    tokenizer = real_tokenizer(kind)
    text = "北京是中华人民共和国的首都。" * 80 + " 👨‍👩‍👧‍👦 end"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert len(prompt) > 300
    generated = tokenizer.encode("答案是：龘 🚀 the answer " * 4, add_special_tokens=False)
    lengths = []
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=prompt)
    real = detokenizer._decode
    monkeypatch.setattr(detokenizer, "_decode", lambda ids: lengths.append(len(ids)) or real(ids))
    joined = "".join(detokenizer.add(i) for i in generated) + detokenizer.flush()
    assert joined == generated_text(tokenizer, prompt, generated)
    assert max(lengths) <= 3 * 6 + 8  # the window and the longest byte run held back (🚀: 4 bytes)


def test_a_byte_run_is_held_until_it_ends(real_tokenizer):
    """ByteFallback decodes a run of byte tokens as a whole: "中" followed by a stray byte is four
    U+FFFD, not "中" and one. Emitting "中" when its three bytes arrived (the old rule: nothing ends
    in U+FFFD) made the stream disagree with the decode for good."""
    tokenizer = real_tokenizer("sentencepiece")
    word = tokenizer.convert_tokens_to_ids("▁the")
    zhong = [sp_byte(tokenizer, b) for b in "中".encode()]
    for ids in (
        [*zhong, sp_byte(tokenizer, 0xE4), word],  # valid, then invalid: all four become U+FFFD
        [word, *zhong * 3, sp_byte(tokenizer, 0xE4), word, word],  # a run longer than the window
        [*zhong, tokenizer.bos_token_id, sp_byte(tokenizer, 0xE4), word],  # a skipped special inside
        [*zhong, word, *zhong],
    ):  # valid runs: "中 the中"
        joined, deltas = streamed(tokenizer, ids)
        assert joined == tokenizer.decode(ids, skip_special_tokens=True), ids
    assert tokenizer.decode([*zhong, sp_byte(tokenizer, 0xE4), word], skip_special_tokens=True) == "\ufffd" * 4 + " the"


def test_special_tokens_filling_the_window_keep_the_next_space(real_tokenizer):
    """SentencePiece's decoder strips the first space of a text: a window of skipped special tokens
    decodes to nothing and made the next "▁the" lose its space ("a" + "the", decode says "a the")."""
    tokenizer = real_tokenizer("sentencepiece")
    word, other = tokenizer.convert_tokens_to_ids("▁the"), tokenizer.convert_tokens_to_ids("▁a")
    ids = [other, *[tokenizer.bos_token_id] * (WINDOW + 2), word]
    assert streamed(tokenizer, ids)[0] == tokenizer.decode(ids, skip_special_tokens=True) == "a the"
    # the same from a prompt: its special tokens are skipped, so the space stays; a prompt with no
    # text at all is where the text starts, so the space goes, as decode(P + G) drops it
    assert streamed(tokenizer, [word], [other, *[tokenizer.bos_token_id] * (3 * WINDOW)])[0] == " the"
    assert streamed(tokenizer, [word], [tokenizer.bos_token_id] * (3 * WINDOW))[0] == "the"
    assert streamed(tokenizer, [*[tokenizer.bos_token_id] * (WINDOW + 2), word], [other])[0] == " the"


def test_byte_fallback_ids_are_the_sentencepiece_byte_tokens(real_tokenizer):
    from aieng.engine.detokenize import byte_fallback_ids

    assert byte_fallback_ids(real_tokenizer("sentencepiece")) == frozenset(range(3, 259))
    assert byte_fallback_ids(real_tokenizer("byte_level")) == frozenset()


@pytest.mark.parametrize("kind", KINDS)
def test_token_texts_are_the_text_each_token_adds(real_tokenizer, kind):
    """For every token of the vocabulary: its bytes, joined after any text, add exactly its text;
    a SentencePiece "▁word" is " word" (decode([id]) alone strips that space)."""
    tokenizer = real_tokenizer(kind)
    texts = TokenTexts(tokenizer)
    anchor = tokenizer.encode("x", add_special_tokens=False)
    specials = set(tokenizer.all_special_ids)
    for token_id in range(len(tokenizer)):
        text, raw = texts(token_id)
        if token_id in specials:
            assert text == tokenizer.convert_ids_to_tokens(token_id)
            continue
        assert bytes(raw).decode("utf-8", errors="replace") == text
        if "\ufffd" not in text:
            after = tokenizer.decode([*anchor, token_id])
            assert after == tokenizer.decode(anchor) + text
    if kind == "sentencepiece":
        assert texts(tokenizer.convert_tokens_to_ids("▁the")) == (" the", list(b" the"))
        assert texts(sp_byte(tokenizer, 0xE4)) == ("\ufffd", [0xE4])


def test_the_fixtures_are_shaped_like_real_tokenizers(real_tokenizer):
    """What the HTTP tests rely on: a large byte-level vocabulary, and a byte-fallback one in which
    rare Chinese characters and emoji are byte tokens; both with bos/eos and a system prompt."""
    byte_level, sentencepiece = real_tokenizer("byte_level"), real_tokenizer("sentencepiece")
    assert len(byte_level) >= 32000
    rare = byte_level("𠀀", add_special_tokens=False)["input_ids"]  # CJK extension B: split into byte pieces
    assert len(rare) > 1 and all("\ufffd" in byte_level.decode([i]) for i in rare)
    pieces = sentencepiece.convert_ids_to_tokens(sentencepiece("龘 🚀 北京", add_special_tokens=False)["input_ids"])
    assert {"<0xE9>", "<0xBE>", "<0x98>", "<0xF0>", "<0x9F>", "<0x9A>", "<0x80>"} <= set(pieces)  # 龘, 🚀
    assert not any(
        p.startswith("<0x")
        for p in sentencepiece.convert_ids_to_tokens(
            sentencepiece("今天天气很好", add_special_tokens=False)["input_ids"]
        )
    )  # common characters are whole
    for tokenizer in (byte_level, sentencepiece):
        assert tokenizer.bos_token_id is not None and tokenizer.eos_token_id is not None
        rendered = tokenizer.apply_chat_template(
            [{"role": "system", "content": "S 系统"}, {"role": "user", "content": "U"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert rendered.startswith(tokenizer.bos_token) and "S 系统" in rendered


def test_a_reply_reads_on_from_its_prompt(real_tokenizer):
    """ "The capital of France is" then "▁P a r is": SentencePiece's decoder strips the first space of
    a text, so the generated ids decoded alone say "Paris" and prompt + reply read "...isParis".
    The reply is the text its tokens add after the prompt, " Paris", as vLLM and TGI send it."""
    import torch

    from aieng.engine import GenerationRequest, SamplingParams
    from aieng.engine.row import Row

    tokenizer = real_tokenizer("sentencepiece")
    prompt = tokenizer("The capital of France is")["input_ids"]
    generated = tokenizer.encode("Paris", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(generated)[0] == "▁P"
    assert tokenizer.decode(generated, skip_special_tokens=True) == "Paris"  # the first space stripped
    row = Row.start(
        GenerationRequest("r", prompt, SamplingParams(max_tokens=len(generated))), tokenizer, torch.device("cpu")
    )
    text = "".join(row.advance(t, eos_ids={tokenizer.eos_token_id}, context_length=512).text for t in generated)
    assert text == " Paris"
    assert (
        tokenizer.decode(prompt, skip_special_tokens=True) + text
        == tokenizer.decode(prompt + generated, skip_special_tokens=True)
        == "The capital of France is Paris"
    )
