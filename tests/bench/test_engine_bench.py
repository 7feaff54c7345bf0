"""``aieng bench engine``: run for real on the tiny shape (fast, random weights), its batch-1 step
split by part and said as a share of the read-bandwidth ceiling, and its command."""

import json

import pytest

from aieng.bench.engine_bench import run_engine_bench
from aieng.engine import EngineConfig
from tests.command import aieng


@pytest.fixture(scope="module")
def tiny(tiny_shape_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_shape_model_dir, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(tiny_shape_model_dir, local_files_only=True)


def test_the_batch1_step_is_split_by_part_and_said_against_the_memory_limit(tiny):
    model, tokenizer = tiny
    result = run_engine_bench(
        model, tokenizer, new_tokens=4, repeats=1, label="tiny", engine_config=EngineConfig(compile=False)
    )
    split = result.b1_split_ms
    assert set(split) == {"step", "layers", "output_projection", "sampling", "other"}
    assert split["step"] == pytest.approx(
        sum(split[k] for k in ("layers", "output_projection", "sampling", "other")), rel=0.5
    )
    assert result.b1_step_bytes > model.lm_head.weight.nbytes // 2  # the layers and the output projection
    assert result.read_gb_s > 0
    ceiling = result.read_gb_s * 1e9 / result.b1_step_bytes
    assert result.b1_share_of_limit == pytest.approx(1000 / split["step"] / ceiling)
    assert result.to_dict()["b1_split_ms"]["step"] == round(split["step"], 3)


def test_the_command_prints_the_split_and_skips_the_bandwidth_when_asked(tiny_shape_model_dir):
    args = ("bench", "engine", "--model", str(tiny_shape_model_dir), "--new-tokens", "4", "--repeats", "1")
    done = aieng(*args, "--no-compile", "--no-memory")
    assert done.returncode == 0, done.stderr
    for part in ("batch-1 decode step", "layers", "output_projection", "sampling", "other"):
        assert part in done.stdout, part
    assert "bandwidth not measured: --no-memory" in done.stdout
    as_json = aieng(*args, "--no-compile", "--no-memory", "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["read_gb_s"] is None and data["b1_share_of_limit"] is None and data["b1_step_bytes"] > 0
