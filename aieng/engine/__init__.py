"""Text generation: the hand-written prefill/decode loop over a continuously batched KV cache.

- ``engine``: the Engine (prefill, decode, remove; generate and stream on top)
- ``kv_batch``: the right-aligned batch cache rows join and leave
- ``sampling``, ``stops``, ``detokenize``: per-row sampling, stop strings, incremental text
- ``params``: sampling parameters and request validation
"""

from aieng.engine.engine import Engine, EngineConfig, GenerationRequest, TokenEvent
from aieng.engine.params import GenerationResult, SamplingParams, validate_request

__all__ = ["Engine", "EngineConfig", "GenerationRequest", "GenerationResult", "SamplingParams", "TokenEvent",
           "validate_request"]
