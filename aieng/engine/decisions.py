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
        return (
            f"{self.runner} forward ({self.runner_why}); weights: {self.weights}; KV cache: {self.kv_cache} "
            f"({self.kv_cache_why}); decode attention: {self.decode_attention}; compile: {self.compile}"
        )

    def fields(self) -> dict:
        return asdict(self)


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def engine_decisions(engine) -> EngineDecisions:
    """The choices ``engine`` (an ``aieng.engine.Engine``) runs with: its runner's, and why that runner."""
    runner = engine.runner
    choices = runner.describe(engine.config)
    return EngineDecisions(
        runner.kind,
        runner.path_reason,
        str(runner.device),
        choices.weights,
        choices.kv_cache,
        choices.kv_cache_why,
        choices.decode_attention,
        choices.compile,
    )


def setting_said(name: str, value: str) -> str:
    return f"{name}={value}: measured on this host" if value == "auto" else f"{name}={value}"


def kv_why(config, dtype: torch.dtype, activations_dtype: torch.dtype, decode_kernel: bool) -> str:
    """Why the native KV cache has ``dtype`` (``slots.kv_dtype``'s rule, in words)."""
    if config.kv_cache_dtype != "auto":
        return f"AIENG_KV_CACHE_DTYPE={config.kv_cache_dtype}"
    if dtype != activations_dtype:
        return (
            "AIENG_KV_CACHE_DTYPE=auto: the one-row step streams bf16 weights and aieng's kernel reads the "
            "cache, so half the bytes per decoded token"
        )
    if activations_dtype != torch.float32:
        return "AIENG_KV_CACHE_DTYPE=auto: the activations' dtype"
    if not decode_kernel:
        return "AIENG_KV_CACHE_DTYPE=auto: the activations' dtype, since PyTorch's attention would widen a bf16 cache"
    return "AIENG_KV_CACHE_DTYPE=auto: the activations' dtype, since the one-row step runs fp32 weights here"
