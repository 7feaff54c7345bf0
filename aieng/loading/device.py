"""Device and dtype policy, explicit so the same package runs on a CPU box and a GPU host.

- device ``auto``: CUDA when present, else CPU. ``torch.cuda.is_available()`` does not create a
  CUDA context, so choosing a device is safe before gunicorn forks.
- dtype ``auto``: on CUDA bfloat16 when the GPU supports it, else float16. On the CPU the
  checkpoint's own bfloat16 when the native forward serves it (``stored``): it computes in fp32
  and widens bf16 weights as it reads them, and its format plan makes an fp32 copy only for the
  step sizes where fp32 multiplies faster on this CPU, so an upcast at load would double the
  weights' memory and add nothing. Everything else loads in float32 on the CPU (bf16 matmuls are
  slow on CPUs without bf16 units, and fp16 is unsupported by many CPU kernels).
- compute dtype (``compute_dtype``): what activations run in; float32 on the CPU whatever the
  weights, the weights' dtype on a GPU.
"""

from __future__ import annotations

import torch

from aieng.errors import ModelLoadError

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def choose_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {requested!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {requested!r} requested but CUDA is not available on this host; use --device cpu")
    return device


def wants_cuda(requested: str) -> bool:
    """Whether ``requested`` ends up on CUDA, decided without creating a CUDA context (safe before fork)."""
    return requested.startswith("cuda") or (requested == "auto" and torch.cuda.is_available())


def choose_dtype(requested: str, device: torch.device, stored: str | None = None) -> torch.dtype:
    """``stored``: the checkpoint's dtype when the native forward serves it, else None."""
    if requested == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if stored == "bfloat16" else torch.float32
    if requested not in DTYPES:
        raise ModelLoadError(f"unknown dtype {requested!r}: use auto, float32, bfloat16 or float16")
    return DTYPES[requested]


def compute_dtype(weights: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype activations, norms and the KV cache's ``model`` choice run in: float32 on the CPU
    (a bf16 weight is widened as it is read; rounding activations too would cost accuracy for no
    speed, since the weights' bytes are what a step waits for), the weights' own on a GPU."""
    return torch.float32 if device.type == "cpu" else weights
