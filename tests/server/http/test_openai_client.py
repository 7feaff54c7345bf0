"""The official `openai` client against the real server on loopback."""

import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="not-needed", max_retries=0, timeout=60)


def test_completions(client, render):
    out = client.completions.create(
        model="demo", prompt=render("reverse: apple stone river"), max_tokens=16, temperature=0
    )
    assert out.choices[0].text == "river stone apple" and out.choices[0].finish_reason == "stop"
    assert (
        out.usage.completion_tokens > 0
        and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    )


def test_chat_completions_apply_the_chat_template(client):
    out = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "reverse: apple stone river"}], max_tokens=16, temperature=0
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == "river stone apple"
    assert out.object == "chat.completion"


def test_streaming_completions(client, render):
    stream = client.completions.create(
        model="demo",
        prompt=render("json: name=ana age=31"),
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == '{"name": "ana", "age": 31}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 3


def test_streaming_chat(client):
    stream = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "add: 27+58"}], max_tokens=8, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "85"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_too_long_prompt_is_a_bad_request_with_the_message(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="demo", prompt="apple " * 600, max_tokens=16)
    assert info.value.status_code == 400
    assert "maximum context length is 512" in str(info.value)
    assert info.value.body["code"] == "context_length_exceeded"


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])


def test_completion_logprobs_match_the_text_and_rank_the_chosen_token_first(client, render):
    out = client.completions.create(
        model="demo", prompt=render("reverse: apple stone river"), max_tokens=16, temperature=0, logprobs=3
    )
    choice = out.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens).startswith(choice.text)  # the EOS token's text (empty or special) may follow
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == out.usage.completion_tokens
    assert all(x <= 0 for x in lp.token_logprobs)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and max(top.values()) == pytest.approx(logprob, abs=1e-5)  # greedy: chosen is the best
        assert top.get(token, logprob) == pytest.approx(logprob, abs=1e-5)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_chat_logprobs_streamed_equal_the_whole_reply_s(client):
    messages = [{"role": "user", "content": "json: name=ana age=31"}]
    whole = client.chat.completions.create(
        model="demo", messages=messages, max_tokens=40, temperature=0, logprobs=True, top_logprobs=2
    )
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content).startswith(whole.choices[0].message.content)
    assert bytes(b for t in content for b in t.bytes).decode().startswith(whole.choices[0].message.content)
    assert all(
        len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5) for t in content
    )
    stream = client.chat.completions.create(
        model="demo", messages=messages, max_tokens=40, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = [t for chunk in stream for t in (chunk.choices[0].logprobs.content if chunk.choices[0].logprobs else [])]
    assert [(t.token, t.bytes) for t in streamed] == [(t.token, t.bytes) for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)


def test_no_logprobs_unless_asked(client):
    out = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "add: 2+3"}], max_tokens=4, temperature=0
    )
    assert out.choices[0].logprobs is None


def test_sampled_tokens_logprobs_are_the_models_not_the_temperatures(client, render):
    """Logprobs are the model's distribution (before temperature): a sampled token's logprob is in the
    top list whenever it is one of the top tokens, whatever the temperature."""
    out = client.completions.create(
        model="demo", prompt=render("reverse: apple stone river"), max_tokens=12, temperature=1.5, seed=3, logprobs=5
    )
    lp = out.choices[0].logprobs
    for _token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= max(top.values()) + 1e-6


def test_echo_puts_the_prompt_before_the_completion(client, render):
    prompt = render("add: 27+58")
    out = client.completions.create(model="demo", prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert out.choices[0].text == prompt + "85"
    stream = client.completions.create(model="demo", prompt=prompt, max_tokens=4, temperature=0, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in stream) == prompt + "85"


def test_echo_with_logprobs_scores_the_prompt_as_generation_scored_it(client, render):
    """What evaluation harnesses send to score a text: echo + logprobs. Scoring a prompt followed
    by the model's own answer gives the answer's tokens the logprobs that generating them had."""
    prompt = render("reverse: apple stone river")
    generated = client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=0, logprobs=1)
    answer = generated.choices[0].text
    scored = client.completions.create(
        model="demo", prompt=prompt + answer, max_tokens=1, temperature=0, logprobs=2, echo=True
    )
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text.startswith(prompt + answer)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token has no context
    assert "".join(lp.tokens).startswith(prompt + answer) and lp.text_offset[0] == 0
    n = len(generated.choices[0].logprobs.tokens) - 1  # the generated EOS is not in the scored text
    prompt_tokens = scored.usage.prompt_tokens
    assert lp.tokens[prompt_tokens - n : prompt_tokens] == generated.choices[0].logprobs.tokens[:n]
    assert lp.token_logprobs[prompt_tokens - n : prompt_tokens] == pytest.approx(
        generated.choices[0].logprobs.token_logprobs[:n], abs=2e-3
    )
    stream = client.completions.create(
        model="demo", prompt=prompt + answer, max_tokens=1, temperature=0, logprobs=2, echo=True, stream=True
    )
    first = next(iter(stream)).choices[0]  # streamed, the echo chunk carries the prompt's logprobs
    assert first.text == prompt + answer and first.logprobs.tokens == lp.tokens[:prompt_tokens]
    assert first.logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:prompt_tokens], abs=1e-6)


def test_top_logprobs_without_logprobs_and_too_many_are_400s(client, render):
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "add: 2+3"}], top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model="demo", prompt="add: 2+3", logprobs=21)


def test_strict_types_through_the_client(client):
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.completions.create(model="demo", prompt="add: 2+3", extra_body={"stream": "yes"})


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_response_format_json_schema_and_json_object(client):
    import json

    import jsonschema

    messages = [{"role": "user", "content": "json: name=ana age=31"}]
    out = client.chat.completions.create(
        model="demo",
        messages=messages,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    assert json.loads(out.choices[0].message.content) == {"name": "ana", "age": 31}
    # A prompt of another task: the free model answers with digits, the constrained one with JSON.
    messages = [{"role": "user", "content": "add: 27+58"}]
    out = client.chat.completions.create(
        model="demo",
        messages=messages,
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
    out = client.chat.completions.create(
        model="demo", messages=messages, max_tokens=60, temperature=0, response_format={"type": "json_object"}
    )
    assert out.choices[0].finish_reason == "length" or isinstance(json.loads(out.choices[0].message.content), dict)


def test_guided_regex_and_choice_stream_too(client, render):
    out = client.completions.create(
        model="demo", prompt=render("add: 27+58"), max_tokens=10, temperature=0, extra_body={"guided_regex": "[0-9]{3}"}
    )
    assert len(out.choices[0].text) == 3 and out.choices[0].text.isdigit()
    stream = client.completions.create(
        model="demo",
        prompt=render("add: 27+58"),
        max_tokens=10,
        temperature=0.9,
        stream=True,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) in ("yes", "no")
    assert chunks[-1].choices[0].finish_reason == "stop"
    out = client.completions.create(
        model="demo",
        prompt=render("add: 27+58"),
        max_tokens=10,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["apple", "river"]}},
    )
    assert out.choices[0].text in ("apple", "river")


@pytest.mark.parametrize(
    "extra,param,fragment",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}},
                }
            },
            "response_format.json_schema.schema",
            "strng",
        ),
        ({"guided_regex": "([a-z"}, "guided_regex", "regex"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_regex": "[0-9]", "guided_choice": ["a"]}, "guided_choice", "at most one"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "json_object"),
    ],
)
def test_bad_constraints_are_400s_naming_the_problem(client, extra, param, fragment):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="demo", prompt="add: 2+3", max_tokens=4, extra_body=extra)
    error = info.value.body
    assert error["param"] == param and fragment in error["message"], error


def test_n_choices_whole_and_streamed(client, render):
    out = client.completions.create(
        model="demo", prompt=render("add: 27+58"), max_tokens=8, temperature=1.5, seed=11, n=3, logprobs=1
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") and c.logprobs.tokens for c in out.choices)
    tokens = sum(len(c.logprobs.tokens) for c in out.choices)
    assert out.usage.completion_tokens == tokens  # usage counts every choice's tokens
    stream = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "add: 27+58"}],
        max_tokens=8,
        temperature=0,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    chunks = list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "85", 1: "85"} and finishes == {0: "stop", 1: "stop"}
    assert chunks[-1].usage.completion_tokens >= 4


def test_n_beyond_the_limits_is_a_400(client):
    for n, fragment in ((0, "between 1 and 16"), (17, "between 1 and 16")):
        with pytest.raises(openai.BadRequestError, match=fragment):
            client.completions.create(model="demo", prompt="add: 2+3", max_tokens=2, n=n)
