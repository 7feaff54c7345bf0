"""What the engine hands a runner for one step, and what comes back.

Two runners implement the same four verbs (admit, start_decoding, release, forward):
``native_runner.NativeRunner`` (Llama family: static slot cache, chunked prefill mixed with
decode, weight formats by batch size, a compiled decoder layer) and ``hf_runner.HFRunner``
(any other transformers causal LM: the model's own forward over a dynamic cache, whole prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens ``token_ids`` of one request, at positions ``start``.. in its row."""

    request_id: str
    token_ids: list[int]
    start: int
    last: bool  # the chunk ends the prompt: the step samples the row's first token


@dataclass
class StepLogits:
    decode: torch.Tensor | None = None  # [B, vocab], one row per decoding row in slot order
    prefill: torch.Tensor | None = None  # [k, vocab], one row per chunk with ``last``, in chunk order
    failed: dict[str, BaseException] = field(default_factory=dict)  # request id -> out of memory
    prefill_s: float | None = None
    decode_s: float | None = None
