"""Demo tokenizer: byte-level BPE with single digits, special tokens, and the chat template."""

import json

import pytest
from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer

from aieng.demo.corpus import Example, held_out_examples, training_examples
from aieng.demo.tokenizer import (
    ASSISTANT,
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    USER,
    conversation,
    encode_documents,
    render_documents,
    save_tokenizer,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def corpus():
    return training_examples(0, 3000)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer([t for e in corpus for t in (e.system, e.prompt, e.answer) if t], vocab_size=512)


def test_special_tokens_have_fixed_ids_and_roles(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == (PAD, BOS, EOS)
    assert tokenizer.padding_side == "left"
    assert tokenizer.model_max_length == 512
    assert len(tokenizer) <= 512


def test_round_trip_of_corpus_and_arbitrary_text(tokenizer, corpus):
    texts = [e.prompt for e in corpus[:200]] + [e.answer for e in corpus[:200]]
    texts += ["héllo wörld 🙂 — 12345", "  two  spaces\nand a newline\t", '{"a": [1, 2]}']
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_digits_are_single_tokens(tokenizer):
    tokens = tokenizer.tokenize("add: 27+58")
    assert [t for t in tokens if any(c.isdigit() for c in t)] == ["2", "7", "5", "8"]


def test_encoding_adds_no_special_tokens(tokenizer):
    assert tokenizer("apple")["input_ids"] == tokenizer("apple", add_special_tokens=False)["input_ids"]


def test_chat_template_renders_the_documented_format(tokenizer):
    messages = [{"role": "user", "content": "add: 27+58"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == f"{BOS}{USER}add: 27+58{EOS}{ASSISTANT}"
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": "85"}], tokenize=False)
    assert full == f"{BOS}{USER}add: 27+58{EOS}{ASSISTANT}85{EOS}"
    system = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}] + messages, tokenize=False)
    assert system == f"{BOS}<|system|>Be brief.{EOS}{USER}add: 27+58{EOS}"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.convert_tokens_to_ids(ASSISTANT)
    # The plain text of the prompt tokenizes to the same ids (a completion request works too).
    assert tokenizer(prompt)["input_ids"] == ids


def test_chat_template_refuses_unknown_roles(tokenizer):
    with pytest.raises(TemplateError, match="roles must be"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_fast_rendering_equals_the_template(tokenizer, corpus):
    examples = corpus[:300] + [Example("add", "add: 10+11", "21", system="Be brief.")]
    for with_answer in (True, False):
        fast = render_documents(tokenizer, examples, with_answer=with_answer)
        slow = tokenizer.apply_chat_template(
            [conversation(e, with_answer=with_answer) for e in examples],
            tokenize=False,
            add_generation_prompt=not with_answer,
        )
        assert fast == slow
    docs = render_documents(tokenizer, examples)
    assert encode_documents(tokenizer, docs) == tokenizer(docs, add_special_tokens=False)["input_ids"]


def test_train_tokenizer_is_deterministic(corpus):
    texts = [e.prompt for e in corpus[:500]] + [e.answer for e in corpus[:500]]
    a = train_tokenizer(texts, vocab_size=400)
    b = train_tokenizer(texts, vocab_size=400)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_saved_tokenizer_reloads_offline_with_its_chat_template(tokenizer, tmp_path):
    save_tokenizer(tokenizer, tmp_path)
    assert not (tmp_path / "chat_template.jinja").exists()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tokenizer.chat_template
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    example = held_out_examples(0, 1)[0]
    messages = conversation(example, with_answer=False)
    assert loaded.apply_chat_template(messages, add_generation_prompt=True) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True
    )
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 0)
