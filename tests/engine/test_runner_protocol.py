"""Both runners implement every member of ``engine.runner.Runner``, and the engine reaches them
through it: a member missing from one runner is an AttributeError at the first request that
needs it, on only one kind of model."""

import inspect

import pytest

from aieng.engine import Engine, EngineConfig
from aieng.engine.runner import Runner, RunnerChoices


def protocol_members() -> set[str]:
    names = set(Runner.__annotations__)
    names |= {name for name, _ in inspect.getmembers(Runner) if not name.startswith("_")}
    return names


@pytest.fixture(scope="module")
def engines(tiny_shape_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_shape_model_dir, local_files_only=True)
    built = {}
    for native in (True, False):
        model = AutoModelForCausalLM.from_pretrained(tiny_shape_model_dir, local_files_only=True)
        built["native" if native else "transformers"] = Engine(
            model, tokenizer, config=EngineConfig(compile=False, native=native, max_rows=4)
        )
    return built


def test_the_protocol_names_what_the_engine_uses():
    assert {
        "forward",
        "admit",
        "release",
        "warm_up",
        "describe",
        "planned_rows",
        "compile_counts",
    } <= protocol_members()


@pytest.mark.parametrize("kind", ["native", "transformers"])
def test_each_runner_implements_every_member(engines, kind):
    runner = engines[kind].runner
    assert runner.kind == kind
    missing = sorted(name for name in protocol_members() if not hasattr(runner, name))
    assert missing == []
    assert isinstance(runner.describe(engines[kind].config), RunnerChoices)
    assert set(runner.compile_counts()) == {"rewarms", "compile_fallbacks"}
    assert runner.planned_rows >= runner.max_rows >= 1 and runner.awaits_cache is False


@pytest.mark.parametrize("kind", ["native", "transformers"])
def test_the_engine_answers_for_its_runner(engines, kind):
    engine = engines[kind]
    assert engine.chunked == (kind == "native") and engine.planned_rows == engine.runner.planned_rows
    assert {"rewarms", "compile_fallbacks", "oom_splits"} <= set(engine.stats)
    assert engine.warmup(progress=lambda detail: None) >= 0
