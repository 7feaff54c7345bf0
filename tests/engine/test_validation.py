"""A request is validated once, before it is queued: one precise message per rule."""

import pytest

from aieng.engine import EngineConfig, SamplingParams, validate_request
from aieng.engine.engine import Engine
from aieng.errors import InvalidRequestError

EAGER = EngineConfig(compile=False)  # the compiled path has its own tests (test_compile.py)


@pytest.mark.parametrize(
    "params,param,fragment",
    [
        (SamplingParams(temperature=-0.1), "temperature", "temperature must be >= 0"),
        (SamplingParams(top_p=0), "top_p", "top_p must be > 0 and <= 1"),
        (SamplingParams(top_p=1.5), "top_p", "top_p must be > 0 and <= 1"),
        (SamplingParams(top_k=-1), "top_k", "top_k must be >= 0"),
        (SamplingParams(max_tokens=0), "max_tokens", "max_tokens must be >= 1"),
        (SamplingParams(stop=("a", "b", "c", "d", "e")), "stop", "at most 4 stop strings"),
        (SamplingParams(repetition_penalty=0), "repetition_penalty", "repetition_penalty must be > 0"),
        (SamplingParams(temperature=float("nan")), "temperature", "temperature must be a finite number"),
        (SamplingParams(temperature=float("inf")), "temperature", "temperature must be a finite number"),
        (SamplingParams(repetition_penalty=float("nan")), "repetition_penalty", "must be a finite number"),
    ],
)
def test_each_invalid_parameter_has_one_precise_message(params, param, fragment):
    with pytest.raises(InvalidRequestError) as info:
        validate_request(3, params, context_length=512)
    assert info.value.param == param and fragment in info.value.message


def test_empty_prompt_is_refused():
    with pytest.raises(InvalidRequestError, match="prompt must not be empty"):
        validate_request(0, SamplingParams(), context_length=512)


def test_context_length_exceeded_names_limit_and_request():
    with pytest.raises(InvalidRequestError) as info:
        validate_request(500, SamplingParams(max_tokens=20), context_length=512)
    assert info.value.code == "context_length_exceeded"
    assert "512" in info.value.message and "520" in info.value.message


def test_generate_validates_its_requests_and_leaves_the_engine_serving(demo, render):
    engine = Engine(*demo, config=EAGER)
    with pytest.raises(InvalidRequestError) as info:
        engine.generate([[5] * 600], SamplingParams())
    assert info.value.code == "context_length_exceeded"
    assert engine.num_running == 0
    assert engine.generate([render("add: 11+11")], SamplingParams(max_tokens=4, temperature=0))[0].text == "22"
