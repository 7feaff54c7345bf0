"""Real-shaped tokenizers end to end, through the served app: one per tokenizer (``real_tokenizers``),
each ``create_app`` on a runtime in this process (``inprocess``, tests/conftest.py), reached over
httpx's ASGI transport: the routes, the detokenizer and the SSE chunks are the served ones.

The random weights emit arbitrary tokens, lone byte tokens and split characters included, so
these generations are the hard cases by construction. What is asserted, for both the byte-level
BPE (Llama 3 / Qwen style) and the SentencePiece-style byte-fallback tokenizer (Llama 2 / Mistral):

- a choice's text is what its tokens add after its prompt, streamed or not:
  ``decode(prompt ids) + text == decode(prompt ids + its ids)`` (``skip_special_tokens=True``), so
  a SentencePiece reply that starts with ``▁P`` reads " P", not "P". A completion prompt that ends
  in byte-fallback tokens (the rare characters and emoji these prompts end with, in SentencePiece)
  keeps its text, and a generated run of stray bytes after it reads as ``aieng.engine.detokenize``
  says (``real_tokenizers.generated_text`` computes it from whole decodes). An incomplete UTF-8
  sequence comes out as the tokenizer's own decoder writes it: U+FFFD, as many as its decoder puts
  there (byte-level: one per maximal invalid sequence; byte fallback: one per byte of a run of byte
  tokens that is not valid UTF-8 as a whole), and a stream holds text back until no later token
  can change it;
- stop strings cut exactly there, wherever the token boundaries fall; ``max_tokens`` generates
  exactly that many tokens;
- ``echo`` returns the prompt as sent, then that text (``decode(prompt + ids)`` where the prompt
  reads on); logprobs name each token as the tokenizer spells it (text and exact bytes), and
  ``text_offset`` says where each token's text starts in the choice's text;
- chat prompts are the tokenizer's own ``apply_chat_template``, token for token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest
from real_tokenizers import generated_text

KINDS = ("byte_level", "sentencepiece")
NAMES = {"byte_level": "bl-llama3-style", "sentencepiece": "sp-llama2-style"}
SYSTEM = "你是一个有用的助手。Answer briefly 🙂"
PROMPTS = {
    "chinese": "北京是中华人民共和国的首都，也是一座历史悠久的城市。龘𠀀",
    "emoji": "👨‍👩‍👧‍👦 family 🇫🇷 flag 👍🏽 ❤️ 1️⃣ 🏳️‍🌈",
    "mixed": "def 你好(x):\n    return x + '🚀'  # 长江 river 🇨🇳",
}
ROUTES = ("completions", "chat")


@dataclass
class Served:
    kind: str
    model: str
    client: httpx.Client
    tokenizer: object


@pytest.fixture(scope="module", params=KINDS)
def served(request, real_model_dirs, real_tokenizer, tmp_path_factory, inprocess):
    """One eager app per tokenizer, serving its random model from a temporary store."""
    from aieng.store import ModelStore

    kind = request.param
    store = ModelStore(tmp_path_factory.mktemp(f"store-{kind}"))
    store.register(real_model_dirs(kind), NAMES[kind], "1")
    store.promote(NAMES[kind], "1")
    return Served(kind, NAMES[kind], inprocess(store.root, NAMES[kind]), real_tokenizer(kind))


def messages(text: str, *, system: str | None = SYSTEM) -> list[dict]:
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]


def call(served: Served, route: str, prompt: str | list[dict], *, stream: bool, **body) -> dict:
    """One request; a stream is folded into the whole reply's shape (text, ids, logprobs, usage)."""
    key = "messages" if route == "chat" else "prompt"
    body = {"model": served.model, key: prompt, "temperature": 0, "return_token_ids": True, **body}
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    if not stream:
        response = served.client.post(path, json=body)
        assert response.status_code == 200, response.text
        reply = response.json()
        choice = reply["choices"][0]
        return {
            "text": choice["message"]["content"] if route == "chat" else choice["text"],
            "finish_reason": choice["finish_reason"],
            "token_ids": choice["token_ids"],
            "prompt_token_ids": reply["prompt_token_ids"] if route == "chat" else choice["prompt_token_ids"],
            "usage": reply["usage"],
            "logprobs": choice["logprobs"],
        }
    body.update(stream=True, stream_options={"include_usage": True})
    folded = {
        "text": "",
        "finish_reason": None,
        "token_ids": [],
        "prompt_token_ids": None,
        "usage": None,
        "logprobs": None,
    }
    with served.client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        assert "error" not in chunk, chunk
        if chunk.get("usage"):
            folded["usage"] = chunk["usage"]
        if "prompt_token_ids" in chunk:
            folded["prompt_token_ids"] = chunk["prompt_token_ids"]
        for choice in chunk["choices"]:
            folded["text"] += choice["delta"].get("content", "") if route == "chat" else choice["text"]
            folded["token_ids"] += choice.get("token_ids", [])
            if "prompt_token_ids" in choice:
                folded["prompt_token_ids"] = choice["prompt_token_ids"]
            folded["finish_reason"] = choice["finish_reason"] or folded["finish_reason"]
            if choice["logprobs"] is not None:
                folded["logprobs"] = _merge_logprobs(folded["logprobs"], choice["logprobs"])
    return folded


def _merge_logprobs(so_far: dict | None, more: dict) -> dict:
    if so_far is None:
        return {key: list(value) for key, value in more.items()}
    return {key: so_far[key] + list(more[key]) for key in more}


def drop_cached(usage: dict | None) -> dict | None:
    return None if usage is None else {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def both(served: Served, route: str, prompt, **body) -> dict:
    """The whole reply, after checking the stream of the same request says exactly the same."""
    whole = call(served, route, prompt, stream=False, **body)
    streamed = call(served, route, prompt, stream=True, **body)
    assert streamed["text"].encode() == whole["text"].encode()
    for key in ("token_ids", "prompt_token_ids", "finish_reason"):
        assert streamed[key] == whole[key], key
    # The counts agree; how many prompt tokens came from the prefix cache does not (the first
    # request of the two left them there).
    assert drop_cached(streamed["usage"]) == drop_cached(whole["usage"])
    if whole["logprobs"] is not None:
        assert _comparable(streamed["logprobs"]) == _comparable(whole["logprobs"])
    return whole


def _comparable(logprobs: dict) -> dict:
    """Logprobs with the floats rounded: a stream and a whole reply are two separate forwards."""
    return json.loads(json.dumps(logprobs), parse_float=lambda v: round(float(v), 3))


def route_prompt(route: str, text: str):
    return messages(text) if route == "chat" else text


def decoded(served: Served, ids) -> str:
    return served.tokenizer.decode(ids, skip_special_tokens=True)


def reads_on(served: Served, reply: dict) -> bool:
    """The reply's text reads on from its prompt: decode(prompt) + text == decode(prompt + ids)."""
    prompt = reply["prompt_token_ids"]
    return decoded(served, prompt) + reply["text"] == decoded(served, prompt + reply["token_ids"])


def expected_text(served: Served, reply: dict, ids=None) -> str:
    """The text the reply's tokens (or the first of them: ``ids``) add after its prompt."""
    return generated_text(served.tokenizer, reply["prompt_token_ids"], reply["token_ids"] if ids is None else ids)


# -- text: streamed == whole == the text the ids add after the prompt ------------------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", PROMPTS)
def test_streamed_whole_and_decoded_text_agree(served, route, name):
    reply = both(served, route, route_prompt(route, PROMPTS[name]), max_tokens=24)
    assert reply["usage"]["completion_tokens"] == len(reply["token_ids"]) > 0
    assert reply["text"] == expected_text(served, reply)
    if route == "chat" or served.kind == "byte_level":  # prompts that end on whole text: it reads on
        assert reads_on(served, reply)


def test_the_generations_split_characters(served):
    """The premise of this module: the model's tokens do not all decode alone (a character split
    across tokens, or a byte that is no character), so the hold-back paths really run."""
    split = 0
    for text in PROMPTS.values():
        ids = call(served, "completions", text, stream=False, max_tokens=24)["token_ids"]
        split += sum("\ufffd" in served.tokenizer.decode([i]) for i in ids)
    assert split >= 3


def test_echo_returns_a_chinese_prompt_exactly(served):
    """Rare characters at the prompt's end are byte tokens in both tokenizers: the echoed prompt is
    the prompt as sent, and the generation follows it with the text its tokens add after it; that
    is decode(prompt + generated) unless the generation's first bytes are a stray run, which would
    make the prompt's own characters U+FFFD there (``aieng.engine.detokenize``)."""
    reply = both(served, "completions", PROMPTS["chinese"], max_tokens=8, echo=True)
    assert decoded(served, reply["prompt_token_ids"]) == PROMPTS["chinese"]
    generated = expected_text(served, reply)
    assert reply["text"] == PROMPTS["chinese"] + generated
    if decoded(served, reply["prompt_token_ids"] + reply["token_ids"]).startswith(PROMPTS["chinese"]):
        assert reply["text"] == decoded(served, reply["prompt_token_ids"] + reply["token_ids"])


def spaced_word(served: Served) -> int:
    """A word token that writes a space first: ``▁the`` (SentencePiece), ``Ġthe`` (byte-level)."""
    ids = served.tokenizer.encode("the" if served.kind == "sentencepiece" else " the", add_special_tokens=False)
    assert len(ids) == 1 and served.tokenizer.convert_ids_to_tokens(ids[0]) in ("▁the", "Ġthe")
    return ids[0]


@pytest.mark.parametrize("route", ROUTES)
def test_a_reply_reads_on_from_its_prompt(served, route):
    """A first token that starts with a space (forced by logit_bias): SentencePiece's ``▁the``
    decoded alone loses its space ("...isthe"); the reply is what it adds after the prompt, " the",
    for completions and chat (a Llama 2 style reply may start with a space, as vLLM sends it)."""
    tokenizer = served.tokenizer
    word = spaced_word(served)
    prompt = route_prompt(route, "The capital of France is")
    reply = both(served, route, prompt, max_tokens=1, logit_bias={str(word): 100})
    assert reply["token_ids"] == [word]
    assert reply["text"].startswith(" ") and reply["text"].strip() == tokenizer.decode([word]).strip()
    assert reads_on(served, reply)
    if route == "completions":  # echo: the prompt and its reply are decode(prompt + generated), offsets in it
        for echo in (False, True):
            more = both(served, route, prompt, max_tokens=2, logit_bias={str(word): 100}, echo=echo, logprobs=1)
            start = len(prompt) if echo else 0
            assert more["text"] == (prompt if echo else "") + " the the"
            assert more["logprobs"]["tokens"][-2:] == [" the", " the"]
            assert more["logprobs"]["text_offset"][-2:] == [start, start + 4]
            if echo:
                assert more["text"] == decoded(served, more["prompt_token_ids"] + [word, word])


@pytest.mark.parametrize("route", ROUTES)
def test_stop_strings_match_the_text_as_it_reads_on(served, route):
    """Stop strings are matched on the text the client receives: the reply's first space, which
    decoding its ids alone would drop with SentencePiece, can start one."""
    word = spaced_word(served)
    prompt = route_prompt(route, "The capital of France is")
    free = both(served, route, prompt, max_tokens=3, logit_bias={str(word): 100})
    assert free["text"].startswith(" ") and len(free["token_ids"]) == 3
    cut = both(served, route, prompt, max_tokens=3, logit_bias={str(word): 100}, stop=[free["text"][:2]])
    assert cut["text"] == "" and cut["finish_reason"] == "stop" and cut["token_ids"] == free["token_ids"][:1]


@pytest.mark.parametrize("route", ROUTES)
def test_every_choice_reads_on_from_the_shared_prompt(served, route):
    """n > 1: the forked choices share the prompt's prefill and its context; each one's text is
    what its own tokens add after the prompt, whole and streamed."""
    key, path = ("messages", "/v1/chat/completions") if route == "chat" else ("prompt", "/v1/completions")
    body = {
        "model": served.model,
        key: route_prompt(route, PROMPTS["mixed"]),
        "n": 3,
        "temperature": 1.0,
        "seed": 5,
        "max_tokens": 12,
        "return_token_ids": True,
    }
    reply = served.client.post(path, json=body).json()
    prompt = reply["prompt_token_ids"] if route == "chat" else reply["choices"][0]["prompt_token_ids"]
    texts = {}
    for choice in reply["choices"]:
        text = choice["message"]["content"] if route == "chat" else choice["text"]
        assert text == generated_text(served.tokenizer, prompt, choice["token_ids"]), choice["index"]
        texts[choice["index"]] = text
    assert len(set(texts.values())) > 1  # three samples, not one three times
    with served.client.stream("POST", path, json={**body, "stream": True}) as response:
        chunks = [
            json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line and line != "data: [DONE]"
        ]
    streamed = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            piece = choice["delta"].get("content", "") if route == "chat" else choice["text"]
            streamed[choice["index"]] = streamed.get(choice["index"], "") + piece
    assert streamed == texts


# -- stop strings ----------------------------------------------------------------------------------


def _boundaries(served: Served, reply: dict) -> list[int]:
    """Positions in the reply's text where one token's text ends and the next one's begins."""
    ids = reply["token_ids"]
    full = expected_text(served, reply)
    found = []
    for k in range(1, len(ids)):
        head = expected_text(served, reply, ids[:k])
        if head and "\ufffd" not in head[-1:] and full.startswith(head) and 0 < len(head) < len(full):
            found.append(len(head))
    return found


def _spanning_stop(text: str, boundaries: list[int], want) -> str | None:
    """A 2-3 character stop string across a token boundary, first found there, satisfying ``want``."""
    for at in boundaries:
        for left, right in ((1, 1), (1, 2), (2, 1)):
            stop = text[at - left : at + right]
            if (
                len(stop) == left + right
                and "\ufffd" not in stop
                and stop.strip()
                and want(stop)
                and text.find(stop) == at - left
            ):
                return stop
    return None


def _cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" or "\u3000" <= ch <= "\u303f" or "\uff00" <= ch <= "\uffef" for ch in text)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("flavour", ["any", "chinese"])
def test_stop_strings_across_token_boundaries_cut_exactly(served, route, flavour):
    prompt = route_prompt(route, PROMPTS["chinese"] if flavour == "chinese" else PROMPTS["mixed"])
    free = both(served, route, prompt, max_tokens=40, ignore_eos=True)
    text = free["text"]
    stop = _spanning_stop(text, _boundaries(served, free), _cjk if flavour == "chinese" else bool)
    assert stop is not None, f"no stop string across a token boundary in {text!r}"
    cut = both(served, route, prompt, max_tokens=40, ignore_eos=True, stop=["never-there", stop])
    assert cut["text"] == text[: text.find(stop)]
    assert cut["finish_reason"] == "stop"
    assert cut["token_ids"] == free["token_ids"][: len(cut["token_ids"])]  # the same greedy tokens, cut short
    assert len(cut["token_ids"]) < len(free["token_ids"])


# -- max_tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("max_tokens", [1, 2, 7, 23])
def test_max_tokens_generates_exactly_that_many(served, route, max_tokens):
    prompt = route_prompt(route, PROMPTS["emoji"])
    reply = both(served, route, prompt, max_tokens=max_tokens, ignore_eos=True)
    assert reply["usage"]["completion_tokens"] == len(reply["token_ids"]) == max_tokens
    assert reply["finish_reason"] == "length"
    assert reply["text"] == expected_text(served, reply)
    longer = call(served, route, prompt, stream=False, max_tokens=30, ignore_eos=True)
    assert reply["token_ids"] == longer["token_ids"][:max_tokens]


# -- logprobs --------------------------------------------------------------------------------------


def token_bytes(tokenizer, token_id: int) -> bytes:
    """A token's exact bytes, from its vocabulary entry (independently of aieng's token_text)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    piece = tokenizer.convert_ids_to_tokens(token_id)
    if token_id in tokenizer.all_special_ids:
        return piece.encode()
    if type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel":
        table = {char: byte for byte, char in bytes_to_unicode().items()}
        return bytes(table[char] for char in piece)
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("▁", " ").encode()


def token_text(tokenizer, token_id: int) -> str:
    raw = token_bytes(tokenizer, token_id)
    return raw.decode("utf-8", errors="replace")


def _check_offsets(
    tokenizer, ids: list[int], tokens: list[str], offsets: list[int], text: str, starts: set[int]
) -> None:
    """``text_offset`` is where each token's text starts in ``text``: a whole token's text is
    found there (a text's first token without the leading space the decoder strips); special
    tokens, whose text the reply leaves out, pieces of characters and byte tokens (a run of them
    decodes as a whole) point between texts."""
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
    checked = 0
    for i, (token_id, token, at) in enumerate(zip(ids, tokens, offsets)):
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if "\ufffd" in token or not token or token_id in tokenizer.all_special_ids or piece.startswith("<0x"):
            continue
        here = text[at : at + len(token)]
        stripped = at in starts and token.startswith(" ") and text[at:].startswith(token[1:])
        assert here == token or stripped, (i, token, at, text[at - 5 : at + 10])
        checked += 1
    assert checked >= len(ids) // 4  # most tokens are whole text


@pytest.mark.parametrize("echo", [False, True])
def test_completion_logprobs_name_the_tokens_and_where_they_start(served, echo):
    prompt = PROMPTS["mixed"]
    reply = both(served, "completions", prompt, max_tokens=16, logprobs=3, echo=echo, ignore_eos=True)
    ids = (reply["prompt_token_ids"] if echo else []) + reply["token_ids"]
    logprobs = reply["logprobs"]
    assert logprobs["tokens"] == [token_text(served.tokenizer, i) for i in ids]
    assert len(logprobs["text_offset"]) == len(ids)
    generated = len(reply["token_ids"])
    assert logprobs["text_offset"][-generated] == (len(prompt) if echo else 0)  # the reply's text starts there
    # only the echoed prompt's first token can have lost its space (its text starts the prompt's);
    # the generated ones are read in the prompt's context
    _check_offsets(
        served.tokenizer, ids, logprobs["tokens"], logprobs["text_offset"], reply["text"], {0} if echo else set()
    )
    assert reply["text"] == (prompt if echo else "") + expected_text(served, reply)
    if echo:
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        assert len(reply["prompt_token_ids"]) == reply["usage"]["prompt_tokens"]
    for value, top in zip(logprobs["token_logprobs"][-generated:], logprobs["top_logprobs"][-generated:]):
        # greedy: the chosen token is the most likely one, and keeps its text's key
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(value, abs=1e-4)


def test_chat_logprobs_carry_each_tokens_exact_bytes(served):
    reply = both(
        served, "chat", messages(PROMPTS["emoji"]), max_tokens=16, logprobs=True, top_logprobs=2, ignore_eos=True
    )
    content = reply["logprobs"]["content"]
    assert len(content) == len(reply["token_ids"]) == reply["usage"]["completion_tokens"]
    for entry, token_id in zip(content, reply["token_ids"]):
        assert bytes(entry["bytes"]) == token_bytes(served.tokenizer, token_id)
        assert entry["token"] == token_text(served.tokenizer, token_id)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy
        for alternative in entry["top_logprobs"]:
            assert bytes(alternative["bytes"]).decode("utf-8", errors="replace") == alternative["token"]
    if served.kind == "byte_level":  # bytes joined are the text: byte-level decoding is exactly that
        joined = b"".join(
            bytes(e["bytes"]) for e, i in zip(content, reply["token_ids"]) if i not in served.tokenizer.all_special_ids
        )
        assert joined.decode("utf-8", errors="replace") == reply["text"]


# -- chat templates --------------------------------------------------------------------------------


CONVERSATIONS = {
    "system": messages("用中文回答：长江有多长？ 🚀"),
    "no-system": messages("Hello 👋 世界", system=None),
    "multi-turn": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "你好"},
        {"role": "assistant", "content": "你好！有什么可以帮你？ 😀"},
        {"role": "user", "content": "  写一首诗  "},
    ],
}


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_chat_prompts_are_the_tokenizers_own_template(served, name):
    conversation = CONVERSATIONS[name]
    expected = served.tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    reply = both(served, "chat", conversation, max_tokens=2)
    assert reply["prompt_token_ids"] == list(expected)
    assert reply["usage"]["prompt_tokens"] == len(expected)
    rendered = served.tokenizer.decode(expected)
    assert conversation[-1]["content"].strip() in rendered
    if conversation[0]["role"] == "system" or served.kind == "byte_level":  # Llama 3 adds a default one
        assert "system" in rendered or "<<SYS>>" in rendered


def test_a_template_that_refuses_the_conversation_is_a_400(served):
    if served.kind != "sentencepiece":
        pytest.skip("only Llama 2's template raises on roles out of order")
    bad = [{"role": "assistant", "content": "我先说"}, {"role": "user", "content": "好"}]
    response = served.client.post("/v1/chat/completions", json={"model": served.model, "messages": bad})
    assert response.status_code == 400, response.text
    assert "alternate" in response.json()["error"]["message"]
