"""model_facts: the one reading of end-of-sequence ids and context length that serving and evaluation share."""

from types import SimpleNamespace

import pytest
from transformers import LlamaConfig

from aieng.model_facts import DEFAULT_CONTEXT_LENGTH, context_length, eos_token_ids, model_context_length


def _model(eos):
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos))


def _tokenizer(eos):
    return SimpleNamespace(eos_token_id=eos)


# -- eos_token_ids -------------------------------------------------------------------------------
def test_the_union_where_the_two_old_readings_differed():
    """A chat model: the generation config names <|im_end|> (and <|endoftext|>), the tokenizer
    another id. The engine used to take only the generation config's, evaluation the union; both
    now stop on every one of them."""
    im_end, endoftext, tokenizer_eos = 151645, 151643, 2
    assert eos_token_ids(_model([im_end, endoftext]), _tokenizer(tokenizer_eos)) == {im_end, endoftext, tokenizer_eos}


def test_the_tokenizers_id_counts_even_when_the_generation_config_names_one():
    assert eos_token_ids(_model(7), _tokenizer(2)) == {7, 2}


@pytest.mark.parametrize(
    "configured, expected",
    [
        (5, {5, 2}),  # an int
        ([5, 6], {5, 6, 2}),  # a list
        ([5, None], {5, 2}),  # a list with a hole
        ((5,), {5, 2}),  # any sequence
        (None, {2}),  # nothing configured: the tokenizer's alone
        ([], {2}),  # an empty list is nothing configured
        (2, {2}),  # the same id twice counts once
    ],
)
def test_generation_config_eos_as_int_list_or_none(configured, expected):
    assert eos_token_ids(_model(configured), _tokenizer(2)) == expected


def test_a_model_without_generation_config_uses_the_tokenizers_id():
    assert eos_token_ids(SimpleNamespace(), _tokenizer(3)) == {3}
    assert eos_token_ids(SimpleNamespace(generation_config=None), _tokenizer(3)) == {3}


def test_a_tokenizer_without_eos_uses_the_generation_configs():
    assert eos_token_ids(_model([8, 9]), _tokenizer(None)) == {8, 9}


@pytest.mark.parametrize("model", [_model(None), _model([]), SimpleNamespace()])
def test_no_eos_anywhere_raises(model):
    with pytest.raises(ValueError, match="end-of-sequence"):
        eos_token_ids(model, _tokenizer(None))


# -- context_length --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config, expected",
    [
        ({"max_position_embeddings": 4096}, 4096),
        ({"n_positions": 1024}, 1024),  # GPT-2
        ({"max_seq_len": 2048}, 2048),
        ({"seq_length": 8192}, 8192),
        ({"max_position_embeddings": 512, "n_positions": 99}, 512),  # the first known key wins
        ({"max_position_embeddings": None, "n_positions": 1024}, 1024),  # a null is not a length
        ({"hidden_size": 64}, None),
    ],
)
def test_context_length_of_a_dict(config, expected):
    assert context_length(config) == expected


def test_context_length_of_a_nested_text_config():
    multimodal = {"model_type": "llava", "text_config": {"max_position_embeddings": 32768}}
    assert context_length(multimodal) == 32768
    assert context_length({"text_config": {"hidden_size": 8}}) is None
    assert context_length({"text_config": None}) is None


def test_the_top_level_length_wins_over_the_text_configs():
    assert context_length({"max_position_embeddings": 100, "text_config": {"max_position_embeddings": 200}}) == 100


def test_context_length_of_a_pretrained_config():
    assert context_length(LlamaConfig(max_position_embeddings=640)) == 640


def test_model_context_length_reads_the_models_config_or_falls_back():
    assert model_context_length(SimpleNamespace(config=LlamaConfig(max_position_embeddings=640))) == 640
    assert model_context_length(SimpleNamespace(config={"hidden_size": 8})) == DEFAULT_CONTEXT_LENGTH
