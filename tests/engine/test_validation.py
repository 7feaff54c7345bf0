import pytest

from aieng.engine import SamplingParams
from aieng.engine.engine import Engine, GenerationRequest
from aieng.errors import InvalidRequestError


@pytest.mark.parametrize("params,param,fragment", [
    (SamplingParams(temperature=-0.1), "temperature", "temperature must be >= 0"),
    (SamplingParams(top_p=0), "top_p", "top_p must be > 0 and <= 1"),
    (SamplingParams(top_p=1.5), "top_p", "top_p must be > 0 and <= 1"),
    (SamplingParams(top_k=-1), "top_k", "top_k must be >= 0"),
    (SamplingParams(max_tokens=0), "max_tokens", "max_tokens must be >= 1"),
    (SamplingParams(stop=("a", "b", "c", "d", "e")), "stop", "at most 4 stop strings"),
    (SamplingParams(repetition_penalty=0), "repetition_penalty", "repetition_penalty must be > 0"),
])
def test_each_invalid_parameter_has_one_precise_message(demo, params, param, fragment):
    engine = Engine(*demo)
    with pytest.raises(InvalidRequestError) as info:
        engine.check(GenerationRequest("r", [5, 6, 7], params))
    assert info.value.param == param and fragment in info.value.message


def test_empty_prompt_is_refused(demo):
    with pytest.raises(InvalidRequestError, match="prompt must not be empty"):
        Engine(*demo).check(GenerationRequest("r", [], SamplingParams()))


def test_context_length_exceeded_names_limit_and_request(demo):
    engine = Engine(*demo)
    with pytest.raises(InvalidRequestError) as info:
        engine.check(GenerationRequest("r", [5] * 500, SamplingParams(max_tokens=20)))
    assert info.value.code == "context_length_exceeded"
    assert "512" in info.value.message and "520" in info.value.message


def test_a_rejected_request_leaves_the_engine_serving(demo, render):
    engine = Engine(*demo)
    with pytest.raises(InvalidRequestError):
        engine.prefill([GenerationRequest("bad", [5] * 600, SamplingParams())])
    assert engine.num_running == 0
    assert engine.generate([render("add: 11+11")], SamplingParams(max_tokens=4, temperature=0))[0].text == "22"
