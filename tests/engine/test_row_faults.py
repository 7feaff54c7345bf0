"""One request's sampling or detokenization fails: that request ends, its batch-mates do not notice.

The faults are injected into one row's own objects (its detokenizer, the sampler for its
parameters): nothing a client can send raises there any more (a temperature of 1e-38, which
used to overflow the draw and fail the whole batch, is greedy now, tested below).
"""

from aieng.engine import GenerationRequest, SamplingParams, sampling

from .conftest import run_until_idle

PROMPTS = ["reverse: egg fish gold", "add: 12+30", "sort: tree king"]


def run(engine, requests, *, sabotage=None):
    """The finishing event of each request, and every event."""
    events = run_until_idle(engine, requests, after_first=sabotage)
    return {e.request_id: e for e in events if e.finished}, events


def requests_for(engine, render, params):
    return [GenerationRequest(str(i), engine.encode(render(p)), params) for i, p in enumerate(PROMPTS)]


def test_a_detokenizer_that_raises_fails_its_request_only(engine, render, caplog):
    params = SamplingParams(max_tokens=12, temperature=0)
    expected, _ = run(engine, requests_for(engine, render, params))

    def broken(token):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")

    finished, _ = run(
        engine, requests_for(engine, render, params), sabotage=lambda e: setattr(e.rows["1"].detokenizer, "add", broken)
    )
    assert finished["1"].finish_reason == "error" and finished["1"].error.code == "row_failed"
    assert "detokenization" in finished["1"].error.message and finished["1"].error.status == 500
    for rid in ("0", "2"):
        assert finished[rid].token_ids == expected[rid].token_ids and finished[rid].finish_reason == "stop"
    assert engine.num_running == 0 and "1" not in engine.rows  # its row and KV slot are gone
    assert any(getattr(r, "event", None) == "engine_row_failed" and r.stage == "detokenization" for r in caplog.records)
    again, _ = run(engine, requests_for(engine, render, params))  # the engine keeps serving
    assert again["1"].token_ids == expected["1"].token_ids


def test_a_sampler_that_raises_fails_its_request_only(engine, render, monkeypatch):
    sampled = SamplingParams(max_tokens=12, temperature=0.7, seed=3)
    greedy = SamplingParams(max_tokens=12, temperature=0)
    reqs = [
        GenerationRequest("greedy", engine.encode(render(PROMPTS[0])), greedy),
        GenerationRequest("sampled", engine.encode(render(PROMPTS[1])), sampled),
        GenerationRequest("other", engine.encode(render(PROMPTS[2])), greedy),
    ]
    expected, _ = run(engine, [GenerationRequest(r.request_id, r.prompt_ids, r.params) for r in reqs])
    real = sampling.sample_row

    def sample_row(logits, params, generator, seen):
        if params.temperature == 0.7:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0 (injected)")
        return real(logits, params, generator, seen)

    monkeypatch.setattr(sampling, "sample_row", sample_row)
    finished, _ = run(engine, reqs)
    assert finished["sampled"].error.code == "row_failed" and "sampling" in finished["sampled"].error.message
    assert finished["greedy"].token_ids == expected["greedy"].token_ids
    assert finished["other"].token_ids == expected["other"].token_ids


def test_a_vanishing_temperature_is_greedy_instead_of_failing_the_batch(engine, render):
    greedy, _ = run(engine, requests_for(engine, render, SamplingParams(max_tokens=12, temperature=0)))
    tiny, _ = run(engine, requests_for(engine, render, SamplingParams(max_tokens=12, temperature=1e-38, seed=1)))
    assert {rid: e.token_ids for rid, e in tiny.items()} == {rid: e.token_ids for rid, e in greedy.items()}
    assert all(e.error is None for e in tiny.values())
