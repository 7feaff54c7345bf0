"""The official `openai` client against the real server on loopback."""

import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="not-needed", max_retries=0, timeout=60)


def test_completions(client, render):
    out = client.completions.create(model="demo", prompt=render("reverse: apple stone river"), max_tokens=16,
                                    temperature=0)
    assert out.choices[0].text == "river stone apple" and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens > 0 and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_completions_apply_the_chat_template(client):
    out = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "reverse: apple stone river"}],
                                         max_tokens=16, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == "river stone apple"
    assert out.object == "chat.completion"


def test_streaming_completions(client, render):
    stream = client.completions.create(model="demo", prompt=render("json: name=ana age=31"), max_tokens=40,
                                       temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == '{"name": "ana", "age": 31}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 3


def test_streaming_chat(client):
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "add: 27+58"}],
                                            max_tokens=8, temperature=0, stream=True)
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
