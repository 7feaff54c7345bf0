"""What the engine chose for a model on this host, and why, in words an operator can act on.

The engine makes several choices on its own at start-up: which forward serves the model
(``serving_path``), which weight format each step size multiplies in (measured, ``formats``), the
KV cache's dtype and how many rows it holds, and which decode attention runs. Each has a setting
that overrides it. ``aieng serve`` logs them in one line with the worker plan (``serving_plan``),
and ``aieng model inspect`` prints them without serving; both read them here, from the engine as
built, so what is reported is what runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class EngineDecisions:
    runner: str  # "native" | "transformers"
    runner_why: str
    device: str
    weights: str
    kv_cache: str
    kv_cache_why: str
    decode_attention: str
    compile: str

    def line(self) -> str:
        return (f"{self.runner} forward ({self.runner_why}); weights: {self.weights}; KV cache: {self.kv_cache} "
                f"({self.kv_cache_why}); decode attention: {self.decode_attention}; compile: {self.compile}")

    def fields(self) -> dict:
        return asdict(self)


def _dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def engine_decisions(engine) -> EngineDecisions:
    """The choices ``engine`` (an ``aieng.engine.Engine``) runs with."""
    from aieng.engine.native_runner import NativeRunner

    runner, config = engine.runner, engine.config
    device = str(runner.device)
    compile_state = "off (AIENG_COMPILE=0)"
    if isinstance(runner, NativeRunner):
        one_row = "bf16" if runner.one_row_bf16 else "fp32"
        weights = (f"{runner.formats.describe()}; one-row steps in {one_row}"
                   f" ({_setting_said('AIENG_WEIGHT_FORMATS', config.weight_formats)})")
        cache = runner.cache
        kv_bytes = cache.shape.bytes_per_token() * (cache.capacity + 1) * runner.planned_rows
        kv = (f"{_dtype(cache.shape.dtype)}, {runner.planned_rows} rows x {cache.capacity} tokens "
              f"({kv_bytes / 2**20:.0f} MiB)")
        kernel = runner.net.dims.decode_kernel
        if config.compile:
            compile_state = "on: the decoder layer, one graph per step shape, built at warm-up"
        return EngineDecisions("native", runner.path_reason, device, weights, kv, _kv_why(config, cache.shape.dtype,
                                                                                          runner.net.dtype, kernel),
                               "aieng's CPU kernel" if kernel else "PyTorch SDPA", compile_state)
    params = next(engine.model.parameters())
    if config.compile:
        compile_state = "on: the whole forward, built at warm-up"
    weights = "int8 dynamic (AIENG_INT8=1)" if config.quantize_int8 else f"{_dtype(params.dtype)} as loaded"
    return EngineDecisions("transformers", runner.path_reason, device, weights,
                           f"{_dtype(params.dtype)}, transformers' dynamic cache, up to {runner.max_rows} rows",
                           "grows with each row's tokens; the native forward's static cache needs its own forward",
                           "the model's own attention", compile_state)


def _setting_said(name: str, value: str) -> str:
    return f"{name}={value}: measured on this host" if value == "auto" else f"{name}={value}"


def _kv_why(config, dtype: torch.dtype, model_dtype: torch.dtype, decode_kernel: bool) -> str:
    if config.kv_cache_dtype != "auto":
        return f"AIENG_KV_CACHE_DTYPE={config.kv_cache_dtype}"
    if dtype != model_dtype:
        return ("AIENG_KV_CACHE_DTYPE=auto: the one-row step streams bf16 weights and aieng's kernel reads the "
                "cache, so half the bytes per decoded token")
    if model_dtype != torch.float32:
        return "AIENG_KV_CACHE_DTYPE=auto: the model's dtype"
    if not decode_kernel:
        return "AIENG_KV_CACHE_DTYPE=auto: the model's dtype, since PyTorch's attention would widen a bf16 cache"
    return "AIENG_KV_CACHE_DTYPE=auto: the model's dtype, since the one-row step runs fp32 weights here"
