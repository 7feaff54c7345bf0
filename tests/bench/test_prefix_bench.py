"""``aieng bench prefix``: its system prompt is the length asked, a conversation that cannot fit the
model's context is refused before any server starts, and the whole command on the demo model
(two real servers, cache on and off) reports hits, the workload and equal greedy answers."""

import json

import pytest

from aieng.bench.prefix_bench import PrefixBenchConfig, check_fits, system_prompt
from aieng.errors import ConfigError
from tests.command import aieng


def test_the_system_prompt_is_as_long_as_asked_and_a_new_opening_makes_it_a_miss(demo_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    shared = system_prompt(tokenizer, 200)
    other = system_prompt(tokenizer, 200, opening="session1")
    assert 190 <= len(tokenizer(shared)["input_ids"]) <= 200
    assert not other.startswith(shared.split()[0]) and system_prompt(tokenizer, 200) == shared  # seeded


def test_a_conversation_past_the_context_is_refused_with_what_to_lower():
    check_fits(PrefixBenchConfig(system_tokens=300, turns=2), 512)
    with pytest.raises(ConfigError, match="past this model's context of 512: lower --system-tokens or --turns"):
        check_fits(PrefixBenchConfig(system_tokens=1000), 512)


@pytest.mark.server
def test_the_command_measures_hits_misses_and_the_workload_on_and_off(session_store):
    refused = aieng("bench", "prefix", "--model", "demo", store=session_store.root)  # 1,000 tokens > 512
    assert refused.returncode != 0 and "lower --system-tokens" in refused.stderr and "Traceback" not in refused.stderr
    done = aieng(
        "bench", "prefix", "--model", "demo", "--system-tokens", "200", "--users", "2", "--turns", "2",
        "--repeats", "1", "--max-tokens", "4", "--json", store=session_store.root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    on, off = result["workload"]["on"], result["workload"]["off"]
    assert on["requests"] == off["requests"] == 4
    assert result["workload"]["answers_equal"] == result["workload"]["answers_equal_rerun"] == 4  # a trained model
    assert on["cached_share"] > 0.5 and off["cached_share"] == 0
    assert result["ttft"]["hit_p50_s"] > 0 and result["ttft"]["miss_p50_s"] > 0
    assert result["targets"]["greedy_answers_no_more_changed_than_a_rerun"] is True
    assert set(result["targets"]) == {
        "hit_ttft_le_0.2x_miss",
        "workload_ge_2x",
        "greedy_answers_no_more_changed_than_a_rerun",
    }
