"""How an engine is built: ``EngineConfig``, passed down from the runtime (``RuntimeConfig.from_settings``).

Every default that is also a setting comes from ``Settings`` (``aieng.settings.DEFAULTS``), so
``EngineConfig()`` in a notebook, a benchmark or a test builds the engine ``aieng serve`` builds
when nothing is set. A test that needs something else says so: ``EngineConfig.exact()`` is the
configuration greedy parity with transformers' ``generate()`` is checked in (fp32 weights and KV
cache; the served default may measure bf16 faster and take it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aieng.settings import DEFAULTS


@dataclass(frozen=True)
class EngineConfig:
    compile: bool = DEFAULTS.compile  # torch.compile (the decoder layer, or the whole forward for other models)
    quantize_int8: bool = DEFAULTS.int8  # dynamic int8 Linear layers on CPU (transformers forward only)
    native: bool = DEFAULTS.native  # the native forward for Llama-family models (static cache, chunked prefill)
    max_rows: int = DEFAULTS.max_batch_size  # rows held at once (KV slots); the scheduler's batch size follows
    kv_cache_bytes: int = DEFAULTS.kv_cache_mb * 2**20  # static KV cache budget; 0 = max_rows full-context rows
    prefill_chunk_tokens: int = DEFAULTS.prefill_chunk_tokens  # prompt tokens prefilled per step (native forward)
    weight_formats: str = DEFAULTS.weight_formats  # auto: measured per step size (native/formats.py) | a fixed one
    decode_attention: str = DEFAULTS.decode_attention  # auto: aieng's CPU kernel when it builds, else SDPA | sdpa
    kv_cache_dtype: str = DEFAULTS.kv_cache_dtype  # auto (native/slots.kv_dtype) | model | bfloat16
    prefix_cache: bool = DEFAULTS.prefix_cache  # free KV rows keep their tokens for new prompts to reuse
    compile_budget_s: float | None = DEFAULTS.compile_budget_s  # warm-up waits this long, then serves eagerly
    oom_degrade: bool = DEFAULTS.oom_degrade  # a row out of memory alone ends with its text (length), not an error
    # Engine-only knobs (no setting): the shapes warm-up runs.
    warmup_prompt_lengths: tuple[int, ...] = (8, 32, 128)
    warmup_batch_sizes: tuple[int, ...] = (1, 8)
    # A shape that takes this long eagerly is paying for its arithmetic, not for the first-call set-up
    # warm-up exists for; the larger shapes after it are skipped (``warmup.warm_up``).
    warmup_eager_shape_limit_s: float = 1.0

    @classmethod
    def exact(cls, **overrides) -> EngineConfig:
        """fp32 weights and KV cache, compilation waited for: the engine greedy parity is checked in."""
        return replace(cls(weight_formats="float32", kv_cache_dtype="model", compile_budget_s=None), **overrides)
