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

from __future__ import annotations

import importlib

#: Where each public name lives. Imported on first use (PEP 562), so that importing a light
#: submodule (``aieng.engine.params`` for the store, the suite file, a runbook) does not import torch.
_HOMES = {
    "Engine": "aieng.engine.engine",
    "EngineConfig": "aieng.engine.config",
    "GenerationRequest": "aieng.engine.request",
    "GenerationResult": "aieng.engine.params",
    "SamplingParams": "aieng.engine.params",
    "StepResult": "aieng.engine.request",
    "TokenEvent": "aieng.engine.request",
    "validate_request": "aieng.engine.params",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'aieng.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
