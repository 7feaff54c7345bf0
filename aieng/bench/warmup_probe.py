"""Measure a cold start in a fresh process: load, optional warm-up / compile, first requests.

A cold start can only be measured in a new process (a warm kernel has already paid for lazy
initialisation), so ``first_request_latency`` runs this module as a child and reads its JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def first_request_latency(
    model_dir: str,
    *,
    warmup: bool,
    compile: bool = False,
    requests: int = 5,
    max_tokens: int = 16,
    users: int = 1,
    timeout: float = 900,
) -> dict:
    """Run a child process and return {load_s, warmup_s, latencies_ms} for the first ``requests``,
    each ``users`` prompts generated together (as that many users at once: a step of 2+ decode
    rows runs a compiled graph, a lone row's step none on the native forward)."""
    args = [sys.executable, "-m", "aieng.bench.warmup_probe", str(model_dir)]
    args += [str(requests), str(max_tokens), str(users)]
    args += ["--warmup"] if warmup else []
    args += ["--compile"] if compile else []
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"warm-up probe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _main(argv: list[str]) -> int:
    start = time.perf_counter()
    from aieng.engine import Engine, EngineConfig, SamplingParams
    from aieng.engine.chat import user_prompt
    from aieng.loading.loader import load_folder

    model_dir, requests, max_tokens, users = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    loaded = load_folder(model_dir)
    load_s = time.perf_counter() - start
    engine = Engine(loaded.model, loaded.tokenizer, config=EngineConfig(compile="--compile" in argv))
    warmup_s = 0.0
    if "--warmup" in argv:
        # A compile past its budget goes on in the background (compile_budget_s); a warmed process
        # is one whose graphs are built, so the warm-up here ends when they are.
        t0 = time.perf_counter()
        engine.warmup()
        engine.wait_for_compile()
        warmup_s = time.perf_counter() - t0
    prompt = user_prompt(loaded.tokenizer, "reverse: apple stone river")
    latencies = []
    for _ in range(requests):
        t0 = time.perf_counter()
        engine.generate([prompt] * users, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
        latencies.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({"load_s": load_s, "warmup_s": warmup_s, "latencies_ms": latencies}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
