"""n > 1: choices share their prompt's prefill, each samples on its own, and the request is one
request to whoever drives the engine (one finishing event, tokens summed, cancelled as one)."""

from aieng.engine import GenerationRequest, SamplingParams
from aieng.scheduler.policy import QueuedRequest, SchedulerConfig, WaitingQueue

from .conftest import run_until_idle


def texts_by_choice(events, request_id):
    out: dict[int, str] = {}
    for e in events:
        if e.request_id == request_id:
            out[e.index] = out.get(e.index, "") + e.text
    return out


def test_greedy_choices_are_the_single_answer_and_the_prompt_is_prefilled_once(engine, render):
    prompt = engine.encode(render("reverse: apple stone river"))
    single = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0))[0]
    calls = engine.counts["prefill_calls"]
    events = run_until_idle(engine, [GenerationRequest("r", prompt, SamplingParams(max_tokens=12, temperature=0, n=3))])
    assert engine.counts["prefill_calls"] == calls + 1  # one prefill for three choices
    assert texts_by_choice(events, "r") == {0: single.text, 1: single.text, 2: single.text}
    finished = [e for e in events if e.finished]
    assert len(finished) == 1 and finished[0].completion_tokens == 3 * single.completion_tokens
    assert sorted(e.index for e in events if e.choice_finish) == [0, 1, 2]
    assert not engine.rows and not engine.choices.groups  # nothing left behind


def test_each_sampled_choice_is_the_request_with_its_own_seed(engine, render):
    """Choice i of a request seeded s samples as a lone request seeded s + i would."""
    prompt = engine.encode(render("add: 27+58"))
    params = SamplingParams(max_tokens=10, temperature=1.5, seed=40)
    alone = [
        engine.generate([prompt], SamplingParams(max_tokens=10, temperature=1.5, seed=40 + i))[0].text for i in range(4)
    ]
    events = run_until_idle(
        engine,
        [
            GenerationRequest("r", prompt, SamplingParams(**{**params.__dict__, "n": 4})),
            GenerationRequest(
                "mate", engine.encode(render("sort: river apple")), SamplingParams(max_tokens=8, temperature=0)
            ),
        ],
    )
    assert texts_by_choice(events, "r") == dict(enumerate(alone))
    assert len(set(alone)) > 1  # the seeds differ, so do the choices


def test_cancelling_a_request_drops_all_its_choices(engine, render):
    request = GenerationRequest(
        "r",
        engine.encode(render("reverse: apple stone river moon")),
        SamplingParams(max_tokens=40, temperature=0, n=3, ignore_eos=True),
    )
    engine.step([request])
    engine.step()
    assert engine.num_running == 3
    assert sorted(engine.remove(["r"])) == ["r", "r#1", "r#2"]
    assert not engine.rows and not engine.choices.groups


def test_a_failing_choice_fails_the_request_and_frees_its_siblings(engine, render):
    request = GenerationRequest(
        "r", engine.encode(render("reverse: apple stone river")), SamplingParams(max_tokens=20, temperature=0, n=3)
    )

    def break_one(engine):
        engine.rows["r#1"].detokenizer.add = lambda token: (_ for _ in ()).throw(RuntimeError("injected"))

    events = run_until_idle(engine, [request], after_first=break_one)
    final = [e for e in events if e.finished]
    assert len(final) == 1 and final[0].error is not None and final[0].request_id == "r"
    assert not engine.rows and not engine.choices.groups


def test_admission_counts_a_request_s_choices_as_rows():
    queue = WaitingQueue(SchedulerConfig(max_batch_size=8))
    for rid, n in (("a", 3), ("b", 4), ("c", 2)):
        queue.add(QueuedRequest(GenerationRequest(rid, [1, 2, 3], SamplingParams(n=n)), arrival=0.0))
    assert [q.request_id for q in queue.pop_joiners(1.0, 8)] == ["a", "b"]  # 3 + 4 rows; c's 2 do not fit
    assert queue.pop_joiners(1.0, 1) == []  # the head waits until its rows are free
    assert [q.request_id for q in queue.pop_joiners(1.0, 2)] == ["c"]
