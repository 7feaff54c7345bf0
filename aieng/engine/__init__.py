"""Text generation: the prefill/decode loop over a continuously batched KV cache.

- ``engine``: the Engine (``step`` = remove + prefill + decode; ``generate`` and ``stream`` on top)
- ``request``: what goes in (GenerationRequest) and comes out (TokenEvent, StepResult)
- ``row``: one running row's state and its finish rule
- ``kv_batch``: the right-aligned batch cache rows join and leave
- ``compiled``: torch.compile of the forward and its warm/rewarm/fallback state
- ``oom``: out-of-memory detection and the bisection prefill and decode share
- ``sampling``, ``stops``, ``detokenize``: per-row sampling, stop strings, incremental text
- ``params``: sampling parameters and the one request validation
- ``chat``: rendering messages through the model's chat template
- ``reference``, ``parity``: transformers' ``generate`` as the reference the engine must match
- ``serving_path``, ``serving_table``: which forward serves a configuration exactly, or why it is refused
"""

from aieng.engine.config import EngineConfig
from aieng.engine.engine import Engine
from aieng.engine.params import GenerationResult, SamplingParams, validate_request
from aieng.engine.request import GenerationRequest, StepResult, TokenEvent

__all__ = [
    "Engine",
    "EngineConfig",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "StepResult",
    "TokenEvent",
    "validate_request",
]
