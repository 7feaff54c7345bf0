"""Recognise out-of-memory failures on any device, so the engine can split a batch and retry."""

from __future__ import annotations

import torch


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return "out of memory" in text or "can't allocate memory" in text or "failed to allocate" in text
    return False


def release_cached_memory(device: torch.device) -> None:
    """After a CUDA OOM, hand cached blocks back so the retry sees them."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
