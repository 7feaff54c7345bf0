import pytest

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.detokenize import IncrementalDetokenizer
from aieng.engine.stops import StopMatcher

EAGER = EngineConfig(compile=False)  # the compiled path has its own tests (test_compile.py)

TEXTS = [
    "naïve café — 東京タワー 🚀🔥 emoji and ascii",
    "ünïcödé 😀😃😄 mixed 中文字符 text",
    "plain words apple stone river",
]


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenization_equals_full_decode(demo, text):
    _, tokenizer = demo
    ids = tokenizer(text)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)


def test_stop_matcher_holds_back_partial_stops_and_cuts():
    matcher = StopMatcher(("END", "\n\n"))
    assert matcher.feed("hello E") == "hello "
    assert matcher.feed("N") == ""
    assert matcher.feed("X more") == "ENX more"
    assert matcher.feed(" tail\n") == " tail"
    assert matcher.feed("\nignored") == "" and matcher.stopped


def test_stop_matcher_without_stops_passes_through():
    matcher = StopMatcher(())
    assert matcher.feed("abc") == "abc" and not matcher.stopped


def test_stream_deltas_concatenate_to_the_final_text(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    prompt = render("json: name=ana age=31")
    events = list(engine.stream(prompt, SamplingParams(max_tokens=40, temperature=0)))
    final = engine.generate([prompt], SamplingParams(max_tokens=40, temperature=0))[0]
    assert "".join(e.text for e in events) == final.text == '{"name": "ana", "age": 31}'
    assert events[-1].finished and events[-1].finish_reason == "stop"
    assert all(not e.finished for e in events[:-1])


def test_stop_string_is_excluded_and_finishes_the_row(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    prompt = render("reverse: apple stone river")
    events = list(engine.stream(prompt, SamplingParams(max_tokens=16, temperature=0, stop=(" apple",))))
    text = "".join(e.text for e in events)
    assert text == "river stone"
    assert events[-1].finish_reason == "stop"


def test_max_tokens_gives_length(demo, render):
    model, tokenizer = demo
    result = Engine(model, tokenizer, config=EAGER).generate(
        [render("json: name=ana age=31")], SamplingParams(max_tokens=3, temperature=0)
    )[0]
    assert result.finish_reason == "length" and result.completion_tokens == 3


def test_detokenizer_without_a_rust_backend_decodes_the_same(demo):
    _, tokenizer = demo

    class SlowTokenizer:  # only the public decode, as a non-fast tokenizer offers
        def decode(self, ids, **kwargs):
            return tokenizer.decode(ids, **kwargs)

    ids = tokenizer("reverse: ünïcödé 漢字 😀 moon")["input_ids"]
    fast, slow = IncrementalDetokenizer(tokenizer), IncrementalDetokenizer(SlowTokenizer())
    assert fast._backend_decode is not None and slow._backend_decode is None
    deltas = ["".join(d.add(i) for i in ids) + d.flush() for d in (fast, slow)]
    assert deltas[0] == deltas[1] == tokenizer.decode(ids, skip_special_tokens=True)
