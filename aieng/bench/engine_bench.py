"""``aieng bench engine``: the aieng loop against transformers' pipeline and generate().

Same process, same model, same prompts, greedy, a fixed number of new tokens (EOS ignored), one
untimed warm-up per method, then the median over repeats. Ratios are what to quote: absolute
tokens/s on a shared 2-core machine move with the neighbours; ratios measured side by side in
one run much less.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, replace

import torch

from aieng.bench.memory_bench import measure_bandwidth
from aieng.bench.step_profile import batch1_split
from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.chat import user_prompt

BENCH_PROMPTS = [
    "reverse: apple stone river moon",
    "add: 27+58",
    "json: name=ana age=31 city=oslo",
    "sort: river apple stone",
    "reverse: boat door glass milk road",
    "add: 31+94",
    "json: color=red score=7",
    "sort: zoo oak moon king",
]


@dataclass
class EngineBenchResult:
    hf_pipeline_tok_s: float
    hf_generate_tok_s: float
    aieng_b1_tok_s: float
    aieng_b8_tok_s: float
    aieng_b32_tok_s: float
    ratio_vs_generate: float
    ratio_vs_pipeline: float
    b32_over_b1: float
    new_tokens: int
    repeats: int
    model: str
    threads: int
    compile: bool = False
    int8: bool = False
    warmup_s: float = 0.0  # engine.warmup(), which includes torch.compile when on
    eager_b1_tok_s: float | None = None  # with --compile: the same loop uncompiled, measured in the same run
    eager_b32_tok_s: float | None = None
    # A batch-1 decode step, median ms by part (step_profile.batch1_split): layers, output_projection,
    # sampling, other, and the whole step.
    b1_split_ms: dict | None = None
    b1_step_bytes: int | None = None  # weights one batch-1 step reads, in the formats it runs in
    read_gb_s: float | None = None  # this machine's read bandwidth (aieng bench memory), when measured
    b1_share_of_limit: float | None = None  # batch-1 decode steps per second over bandwidth / step bytes

    def to_dict(self) -> dict:
        def rounded(v):
            if isinstance(v, dict):
                return {k: rounded(x) for k, x in v.items()}
            return round(v, 3) if isinstance(v, float) else v

        return {k: rounded(v) for k, v in asdict(self).items()}


def render_prompts(tokenizer, count: int) -> list[str]:
    """Bench prompts, through the chat template when the tokenizer has one."""
    return [user_prompt(tokenizer, BENCH_PROMPTS[i % len(BENCH_PROMPTS)]) for i in range(count)]


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up, not timed
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_engine_bench(
    model,
    tokenizer,
    *,
    new_tokens: int = 32,
    repeats: int = 3,
    label: str = "model",
    engine_config: EngineConfig = EngineConfig(),
    progress=None,
    memory: bool = True,
) -> EngineBenchResult:
    """``memory``: also measure the read bandwidth and say the batch-1 step as a share of its ceiling."""
    from transformers import pipeline

    tick = progress.update if progress is not None else (lambda _=1: None)
    prompts1 = render_prompts(tokenizer, 4)  # batch-1 methods run these one after another
    greedy = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    hf_kwargs = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )

    generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device=model.device)

    def run_pipeline():
        for p in prompts1:
            generator(p, return_full_text=False, **hf_kwargs)

    encoded = [tokenizer(p, return_tensors="pt").to(model.device) for p in prompts1]

    def run_generate():
        with torch.inference_mode():
            for enc in encoded:
                model.generate(**enc, **hf_kwargs)

    engine = Engine(model, tokenizer, config=engine_config)
    warmup_s = engine.warmup()
    ids1 = [engine.encode(p) for p in prompts1]

    def run_aieng(batch, on=engine):
        if batch == 1:
            return lambda: [on.generate([ids], greedy) for ids in ids1]
        ids = [on.encode(p) for p in render_prompts(tokenizer, batch)]
        return lambda: on.generate(ids, greedy)

    tokens1 = new_tokens * len(prompts1)
    pipe_s = _median_time(run_pipeline, repeats)
    tick()
    gen_s = _median_time(run_generate, repeats)
    tick()
    b1_s = _median_time(run_aieng(1), repeats)
    tick()
    b8_s = _median_time(run_aieng(8), repeats)
    tick()
    b32_s = _median_time(run_aieng(32), repeats)
    tick()
    split = batch1_split(engine, ids1[0], steps=max(8, new_tokens))
    step_bytes = engine.one_row_step_bytes()
    read_gb_s = share = None
    if memory:
        bandwidth = measure_bandwidth(repeats=5)
        read_gb_s = bandwidth.read_gb_s
        share = bandwidth.share(1000 / split["step"], step_bytes)
    tick()
    pipe, gen, b1 = tokens1 / pipe_s, tokens1 / gen_s, tokens1 / b1_s
    b32 = 32 * new_tokens / b32_s
    eager_b1 = eager_b32 = None
    if engine.compiled:
        eager = Engine(engine.model, tokenizer, config=replace(engine_config, compile=False, quantize_int8=False))
        eager_b1 = tokens1 / _median_time(run_aieng(1, eager), repeats)
        tick()
        eager_b32 = 32 * new_tokens / _median_time(run_aieng(32, eager), repeats)
        tick()
    return EngineBenchResult(
        hf_pipeline_tok_s=pipe,
        hf_generate_tok_s=gen,
        aieng_b1_tok_s=b1,
        aieng_b8_tok_s=8 * new_tokens / b8_s,
        aieng_b32_tok_s=b32,
        ratio_vs_generate=b1 / gen,
        ratio_vs_pipeline=b1 / pipe,
        b32_over_b1=b32 / b1,
        new_tokens=new_tokens,
        repeats=repeats,
        model=label,
        threads=torch.get_num_threads(),
        compile=engine.compiled,
        int8=engine_config.quantize_int8,
        warmup_s=warmup_s,
        eager_b1_tok_s=eager_b1,
        eager_b32_tok_s=eager_b32,
        b1_split_ms=split,
        b1_step_bytes=step_bytes,
        read_gb_s=read_gb_s,
        b1_share_of_limit=share,
    )
