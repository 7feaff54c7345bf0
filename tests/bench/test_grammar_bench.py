"""``aieng bench grammar`` as a user runs it, and the issue's bar: constrained output is 100%
schema-valid on the demo's held-out json prompts with no accuracy lost."""

import json

from aieng.bench.grammar_bench import json_task_report, schema_for
from aieng.engine import Engine, EngineConfig

from ..command import aieng


def test_constrained_json_is_always_valid_and_never_less_accurate(demo_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, local_files_only=True).eval()
    engine = Engine(model, AutoTokenizer.from_pretrained(demo_model_dir), config=EngineConfig(compile=False))
    for temperature in (0.0, 1.0):
        report = json_task_report(engine, n=48, temperature=temperature)
        assert report["prompts"] == 48
        for mode in ("json_object", "json_schema"):
            assert report[mode]["valid"] == 1.0, report
            assert report[mode]["accuracy"] >= report["free"]["accuracy"], report
    # Sampled, the free model breaks its JSON now and then: the comparison is not vacuous.
    assert report["free"]["valid"] < 1.0 or report["free"]["accuracy"] < 0.9, report


def test_schema_for_keeps_field_order_and_types():
    schema = schema_for({"name": "ana", "age": 31})
    assert list(schema["properties"]) == ["name", "age"] and schema["required"] == ["name", "age"]
    assert schema["properties"]["age"] == {"type": "integer"} and schema["additionalProperties"] is False


def test_bench_grammar_cli_reports_cost_and_effect(demo_store):
    result = aieng(
        "bench", "grammar", "--model", "demo", "--batch", "4", "--new-tokens", "8", "--repeats", "1",
        "--no-compile", "--json", store=demo_store.root,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out["cost"]) == {"forced", "json_task"}
    forced = out["cost"]["forced"]
    assert forced["batch"] == 4 and forced["free_tok_s"] > 0 and forced["constrained_tok_s"] > 0
    assert out["json_task"]["temperature_0"]["json_schema"]["valid"] == 1.0
