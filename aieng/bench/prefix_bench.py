"""``aieng bench prefix``: what the prefix cache saves on chat traffic with a shared system prompt.

Two servers, one after the other on loopback, the same in everything but ``AIENG_PREFIX_CACHE``
(on, then off), each measured once its compilation is done:

1. **A chat workload**, first, so that its first turns arrive together with nothing cached (a
   service's first minute): ``users`` clients at once, each a conversation of ``turns`` turns
   (the shared system prompt, the conversation so far, a new question), greedy, ``max_tokens``
   new tokens per answer (EOS ignored, so both servers do the same work). Requests/s with the
   cache on against off (target: at least twice), the share of prompt tokens read from the cache
   (``usage.prompt_tokens_details.cached_tokens``), and every answer compared between the two.
   The server with the cache runs the workload a second time, and its two runs are compared too:
   a batch of other rows changes a row's arithmetic a little (matrix products blocked by row
   count, prompts chunked as the decode pace allows), and on random weights, whose logits are
   nearly tied, that alone flips some greedy tokens. The cache must change no more answers than
   running again does; on a trained model (the demo) every answer is the same.
2. **Time to first token**, one request at a time, alternating a *hit* (the shared system
   prompt, served before, and a new question) with a *miss* (a system prompt of the same length
   that no request sent before: a new word opens it), ``repeats`` of each. The server without the
   cache answers the hits too: every request is a miss there. Target: hit p50 <= 0.2 x miss p50.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from aieng.bench.load import percentile, run_load, run_sync
from aieng.bench.server_process import ServerProcess

WORDS = (
    "apple stone river moon sun cloud field road tree light water paper glass music house garden "
    "window market winter summer bridge letter mountain island forest"
).split()
QUESTIONS = (
    "reverse: apple stone river",
    "add: 27+58",
    "sort: river apple stone",
    "json: name=ana age=31 city=oslo",
    "reverse: moon sun",
    "add: 3+4",
    "sort: moon cloud apple",
    "json: name=li age=7 city=rome",
)
HIT_TTFT_TARGET = 0.2  # hit p50 at most this share of a miss's
WORKLOAD_TARGET = 2.0  # requests/s with the cache at least this multiple of without


@dataclass(frozen=True)
class PrefixBenchConfig:
    system_tokens: int = 1000  # the shared system prompt's length, in the model's tokens
    users: int = 16
    turns: int = 4
    max_tokens: int = 16  # new tokens per answer (EOS ignored)
    repeats: int = 5  # hits and misses each, for the time to first token


@dataclass
class PrefixBenchResult:
    model: str
    system_tokens: int
    config: dict
    ttft: dict = field(default_factory=dict)  # {"miss_p50_s", "hit_p50_s", "ratio", "off_hit_p50_s"}
    workload: dict = field(default_factory=dict)  # {"on": {...}, "off": {...}, "ratio", "answers_equal", ...}
    targets: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def check_fits(config: PrefixBenchConfig, context_length: int | None, *, per_turn_overhead: int = 32) -> None:
    """The longest conversation (the system prompt, every turn's question, answer and template
    tokens) must fit the context; else a ConfigError that says what to lower."""
    from aieng.errors import ConfigError

    longest = config.system_tokens + config.turns * (config.max_tokens + per_turn_overhead)
    if context_length is not None and longest > context_length:
        raise ConfigError(
            f"a conversation reaches about {longest} tokens ({config.system_tokens} of system prompt + "
            f"{config.turns} turns of about {config.max_tokens + per_turn_overhead}), past this model's context of "
            f"{context_length}: lower --system-tokens or --turns, or bench a model with a longer context "
            "(e.g. `aieng demo build --shape qwen2.5-0.5b`)"
        )


def system_prompt(tokenizer, tokens: int, *, opening: str = "") -> str:
    """Words of a fixed list, seeded, until the text is ``tokens`` tokens long in this tokenizer."""
    rng = random.Random(0)
    words = [opening] if opening else []

    def count(words: list[str]) -> int:  # verbose=False: no warning for a text past the model's length
        return len(tokenizer(" ".join(words), verbose=False)["input_ids"])

    while count(words) < tokens:
        words += [rng.choice(WORDS) for _ in range(max(1, (tokens - len(words)) // 2))]
    while count(words) > tokens and len(words) > 1:
        words.pop()
    return " ".join(words)


def chat_body(model: str, messages: list[dict], max_tokens: int, *, stream: bool = False) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def measure_ttft(base_url: str, model: str, system: str, miss_systems: list[str], progress=None) -> dict:
    """Alternate hits and misses one at a time; the first hit request (untimed) puts the shared
    prompt in the cache."""
    route = "/v1/chat/completions"

    def ttft(system_text: str, question: str) -> float:
        messages = [{"role": "system", "content": system_text}, {"role": "user", "content": question}]
        result = run_load(base_url, [chat_body(model, messages, 4, stream=True)], concurrency=1, route=route)
        if result.ok != 1:
            raise RuntimeError(f"{base_url} failed a time-to-first-token request ({result.status_counts})")
        if progress is not None:
            progress(1)
        return result.ttft_p50_s

    ttft(system, "warm: " + QUESTIONS[0])
    hits, misses = [], []
    for i, miss_system in enumerate(miss_systems):
        misses.append(ttft(miss_system, QUESTIONS[i % len(QUESTIONS)]))
        hits.append(ttft(system, QUESTIONS[(i + 1) % len(QUESTIONS)] + f" ({i})"))
    return {"miss_p50_s": statistics.median(misses), "hit_p50_s": statistics.median(hits)}


async def _conversation(session, url: str, model: str, system: str, user: int, config: PrefixBenchConfig, progress):
    messages = [{"role": "system", "content": system}]
    turns = []
    for turn in range(config.turns):
        messages.append({"role": "user", "content": f"{QUESTIONS[(user + turn) % len(QUESTIONS)]} (user {user})"})
        start = time.perf_counter()
        async with session.post(url, json=chat_body(model, messages, config.max_tokens)) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"user {user}, turn {turn}: HTTP {resp.status}: {body}")
        answer = body["choices"][0]["message"]["content"]
        usage = body["usage"]
        turns.append(
            {
                "latency_s": time.perf_counter() - start,
                "answer": answer,
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            }
        )
        messages.append({"role": "assistant", "content": answer})
        if progress is not None:
            progress(1)
    return turns


def run_workload(base_url: str, model: str, system: str, config: PrefixBenchConfig, progress=None) -> dict:
    """``users`` conversations at once; requests/s over the whole, latency p50/p99, cache share."""

    async def run():
        url = base_url.rstrip("/") + "/v1/chat/completions"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=config.users), timeout=timeout) as s:
            start = time.perf_counter()
            users = await asyncio.gather(
                *(_conversation(s, url, model, system, u, config, progress) for u in range(config.users))
            )
            return users, time.perf_counter() - start

    users, wall = run_sync(run())
    turns = [t for user in users for t in user]
    latencies = [t["latency_s"] for t in turns]
    prompt = sum(t["prompt_tokens"] for t in turns)
    return {
        "requests": len(turns),
        "wall_s": wall,
        "req_per_s": len(turns) / wall,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "prompt_tokens": prompt,
        "cached_share": sum(t["cached_tokens"] for t in turns) / max(1, prompt),
        "answers": [[t["answer"] for t in user] for user in users],
    }


def run_prefix_bench(
    store: Path, model_ref: str, tokenizer, config: PrefixBenchConfig, *, progress=None, log=print
) -> PrefixBenchResult:
    name = model_ref.split("@")[0]
    system = system_prompt(tokenizer, config.system_tokens)
    miss_systems = [
        system_prompt(tokenizer, config.system_tokens, opening=f"session{i}") for i in range(config.repeats)
    ]
    result = PrefixBenchResult(model_ref, len(tokenizer(system, verbose=False)["input_ids"]), asdict(config))
    runs = {}
    for label, on in (("on", "1"), ("off", "0")):
        log(f"[bench prefix] prefix cache {label}: starting the server")
        env = {"AIENG_PREFIX_CACHE": on}
        with ServerProcess(store=store, model=model_ref, extra_args=["--workers", "1"], env=env) as proc:
            proc.wait_until_compiled(log=lambda message: log(f"[bench prefix] {message}"))
            # the workload first, so its first turns are a burst with nothing in the cache yet
            workload = run_workload(proc.base_url, name, system, config, progress)
            rerun = run_workload(proc.base_url, name, system, config, progress) if on == "1" else None
            ttft = measure_ttft(proc.base_url, name, system, miss_systems, progress)
        runs[label] = (ttft, workload, rerun)
    (on_ttft, on_load, on_rerun), (off_ttft, off_load, _) = runs["on"], runs["off"]
    result.ttft = {
        **on_ttft,
        "ratio": on_ttft["hit_p50_s"] / on_ttft["miss_p50_s"],
        "off_hit_p50_s": off_ttft["hit_p50_s"],
        "off_miss_p50_s": off_ttft["miss_p50_s"],
    }
    same = equal_answers(on_load, off_load)
    rerun_same = equal_answers(on_load, on_rerun)
    result.workload = {
        "on": {k: v for k, v in on_load.items() if k != "answers"},
        "off": {k: v for k, v in off_load.items() if k != "answers"},
        "ratio": on_load["req_per_s"] / off_load["req_per_s"],
        "rerun": {k: v for k, v in on_rerun.items() if k != "answers"},
        "answers_equal": same,
        "answers_equal_rerun": rerun_same,
        "answers": on_load["requests"],
    }
    result.targets = {
        "hit_ttft_le_0.2x_miss": result.ttft["ratio"] <= HIT_TTFT_TARGET,
        "workload_ge_2x": result.workload["ratio"] >= WORKLOAD_TARGET,
        "greedy_answers_no_more_changed_than_a_rerun": same >= rerun_same,
    }
    return result


def equal_answers(a: dict, b: dict) -> int:
    return sum(x == y for x, y in zip(sum(a["answers"], []), sum(b["answers"], [])))


def report(result: PrefixBenchResult) -> list[str]:
    c, t, w = result.config, result.ttft, result.workload
    verdict = {True: "met", False: "NOT met"}
    return [
        f"model {result.model}: a {result.system_tokens}-token system prompt, {c['users']} users x {c['turns']} "
        f"turns, {c['max_tokens']} new tokens per answer",
        f"  time to first token, p50 of {c['repeats']}, one request at a time:",
        f"    miss {t['miss_p50_s']:.3f} s   hit {t['hit_p50_s']:.3f} s   hit/miss {t['ratio']:.2f} "
        f"(target <= {HIT_TTFT_TARGET}: {verdict[result.targets['hit_ttft_le_0.2x_miss']]})",
        f"    without the cache: the same hit {t['off_hit_p50_s']:.3f} s, miss {t['off_miss_p50_s']:.3f} s",
        f"  chat workload, {w['on']['requests']} requests:",
        f"    cache on  {w['on']['req_per_s']:.2f} req/s  p50 {w['on']['latency_p50_s']:.2f} s  p99 "
        f"{w['on']['latency_p99_s']:.2f} s  prompt tokens from the cache {w['on']['cached_share']:.0%}",
        f"    cache off {w['off']['req_per_s']:.2f} req/s  p50 {w['off']['latency_p50_s']:.2f} s  p99 "
        f"{w['off']['latency_p99_s']:.2f} s",
        f"    on/off {w['ratio']:.2f} (target >= {WORKLOAD_TARGET}: {verdict[result.targets['workload_ge_2x']]})",
        f"    cache on, run again (the system prompt and every conversation kept): {w['rerun']['req_per_s']:.2f} "
        f"req/s, prompt tokens from the cache "
        f"{w['rerun']['cached_share']:.0%}",
        f"  greedy answers equal with and without the cache: {w['answers_equal']}/{w['answers']}; "
        f"the cached server's two runs: {w['answers_equal_rerun']}/{w['answers']} "
        f"({verdict[result.targets['greedy_answers_no_more_changed_than_a_rerun']]})",
    ]
