"""Out-of-memory is injected (it cannot be produced safely on a shared CI machine)."""

import pytest
import torch

from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams

RUNNERS = {"native": EngineConfig(compile=False), "hf": EngineConfig(compile=False, native=False)}


@pytest.fixture(params=list(RUNNERS))
def config(request) -> EngineConfig:
    return RUNNERS[request.param]


def limit_batch(engine, max_rows, *, poison_length=None):
    """Make the forward pass raise OOM above ``max_rows`` rows (or for a poisoned prompt length)."""
    if hasattr(engine.runner, "net"):
        return _limit_native(engine.runner, max_rows, poison_length)
    real = engine.runner.forward_fn

    class Limited:
        def __getattr__(self, name):  # compile state (active, recover, ...) stays the real one's
            return getattr(real, name)

        def __call__(self, **kwargs):
            ids = kwargs["input_ids"]
            if ids.shape[0] > max_rows:
                raise torch.OutOfMemoryError("injected: CUDA out of memory. Tried to allocate 2.00 GiB")
            if poison_length is not None and ids.shape[1] == poison_length:
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
            return real(**kwargs)

    engine.runner.forward_fn = Limited()


def _limit_native(runner, max_rows, poison_length):
    real = runner._layers

    def limited(plan, *tokens, **kwargs):
        rows = plan.decode_rows + (0 if plan.prefill_slots is None else len(plan.prefill_slots))
        if rows > max_rows:
            raise torch.OutOfMemoryError("injected: CUDA out of memory. Tried to allocate 2.00 GiB")
        # the poisoned prompt fails with whichever chunk reaches its last token (chunk sizes adapt)
        if (
            poison_length is not None
            and plan.prefill_pos is not None
            and bool((plan.prefill_pos == poison_length - 1).any())
        ):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
        return real(plan, *tokens, **kwargs)

    runner._layers = limited


def test_oom_splits_the_batch_and_results_are_unchanged(demo, render, config):
    model, tokenizer = demo
    prompts = [
        render(p)
        for p in [
            "reverse: egg fish gold",
            "add: 12+30",
            "json: pet=cat age=4",
            "sort: tree king",
            "reverse: pen oak sand",
        ]
    ]
    params = SamplingParams(max_tokens=16, temperature=0)
    expected = [r.text for r in Engine(model, tokenizer, config=config).generate(prompts, params)]

    engine = Engine(model, tokenizer, config=config)
    limit_batch(engine, 2)
    got = [r.text for r in engine.generate(prompts, params)]
    assert got == expected
    assert engine.stats["oom_splits"] > 0


def test_a_row_that_cannot_run_alone_fails_alone_and_the_engine_keeps_serving(demo, render, config):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=config)
    good = [
        GenerationRequest(f"ok{i}", engine.encode(render(p)), SamplingParams(max_tokens=12, temperature=0))
        for i, p in enumerate(["reverse: egg fish gold", "add: 22+22"])
    ]
    poison = GenerationRequest("huge", [7] * 97, SamplingParams(max_tokens=12, temperature=0))
    limit_batch(engine, 64, poison_length=97)

    events = engine.prefill(good + [poison])
    failed = [e for e in events if e.request_id == "huge"]
    assert len(failed) == 1 and failed[0].finish_reason == "error" and failed[0].error.code == "out_of_memory"
    while engine.num_running:
        events += engine.decode()
    done = {e.request_id: e for e in events if e.finished}
    assert done["ok0"].finish_reason == "stop" and done["ok1"].finish_reason == "stop"
    assert engine.generate([render("add: 11+11")], SamplingParams(max_tokens=4, temperature=0))[0].text == "22"


def test_decode_oom_splits_the_running_batch(demo, render, config):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=config)
    prompts = [render(p) for p in ["reverse: egg fish gold hill", "json: score=12 city=rome", "sort: wolf cake jam"]]
    params = SamplingParams(max_tokens=16, temperature=0)
    expected = [r.token_ids for r in Engine(model, tokenizer, config=config).generate(prompts, params)]
    requests = [GenerationRequest(str(i), engine.encode(p), params) for i, p in enumerate(prompts)]
    events = engine.prefill(requests)  # all three join while memory is plentiful
    limit_batch(engine, 1)  # then memory shrinks: every decode must split down to single rows
    while engine.num_running:
        events += engine.decode()
    finished = {e.request_id: e.token_ids for e in events if e.finished}
    assert [finished[str(i)] for i in range(3)] == expected


def test_each_step_reports_its_out_of_memory_splits_by_phase_and_the_metric_counts_them(demo, render, config):
    from aieng.observability import metrics
    from aieng.observability.observer import MetricsObserver

    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=config)
    params = SamplingParams(max_tokens=8, temperature=0)
    requests = [
        GenerationRequest(str(i), engine.encode(render(p)), params)
        for i, p in enumerate(["reverse: egg fish gold", "add: 12+30", "sort: tree king"])
    ]
    limit_batch(engine, 1)
    steps = [engine.step(requests)]
    while engine.num_running:
        steps.append(engine.step())
    assert steps[0].oom_splits.get("prefill", 0) > 0
    assert any(step.oom_splits.get("decode", 0) > 0 for step in steps[1:])
    assert sum(sum(step.oom_splits.values()) for step in steps) == engine.stats["oom_splits"]

    before = {phase: metrics.OOM.labels(phase=phase)._value.get() for phase in ("prefill", "decode")}
    observer = MetricsObserver(resource_every_s=1e9)
    for step in steps:
        observer.on_step(step, running=0, waiting=0, now=0.0)
    for phase in ("prefill", "decode"):
        counted = metrics.OOM.labels(phase=phase)._value.get() - before[phase]
        assert counted == sum(step.oom_splits.get(phase, 0) for step in steps)


def test_degraded_mode_ends_a_row_that_cannot_decode_alone_with_what_it_has(demo, render, config):
    from dataclasses import replace

    from aieng.observability import metrics

    model, tokenizer = demo
    params = SamplingParams(max_tokens=12, temperature=0)
    for degrade in (False, True):
        engine = Engine(model, tokenizer, config=replace(config, oom_degrade=degrade))
        request = GenerationRequest("r", engine.encode(render("reverse: egg fish gold")), params)
        poison = GenerationRequest("huge", [7] * 97, params)
        limit_batch(engine, 64, poison_length=97)
        events = engine.prefill([request, poison])  # the prompt that does not fit alone fails in both modes
        assert next(e for e in events if e.request_id == "huge").error.code == "out_of_memory"
        first = [e for e in events if e.request_id == "r"]
        limit_batch(engine, 0)  # then not even one row decodes
        events = engine.decode()
        (last,) = [e for e in events if e.request_id == "r"]
        assert last.finished and engine.num_running == 0
        if not degrade:
            assert last.finish_reason == "error" and last.error.code == "out_of_memory"
            continue
        assert (last.finish_reason, last.finish_cause, last.error) == ("length", "out_of_memory", None)
        assert last.completion_tokens == 1 and last.token_ids == tuple(e.token_id for e in first)
        before = metrics.OOM_DEGRADED.labels(version="v")._value.get()
        metrics.record_finished(last, max_tokens=12, version="v")
        assert metrics.OOM_DEGRADED.labels(version="v")._value.get() == before + 1
