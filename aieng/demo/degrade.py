"""A deliberately degraded copy of a model folder, for release drills (notebook 07, tests).

Every weight matrix gets Gaussian noise of ``noise`` times its own standard deviation, so the
model still loads, runs at the same speed and looks healthy to latency and error counters, but
answers wrongly: exactly the failure only a quality gate or a live quality probe can catch.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def perturbed_copy(
    source: str | Path, target: str | Path, *, noise: float = 1.0, seed: int = 0, only: str | None = None
) -> Path:
    """Copy ``source`` to ``target`` (which must not exist) with noisy weights; with ``only``, just
    the matrices whose name contains it (``"layers.1."``: one decoder layer)."""
    import torch
    from safetensors.torch import load_file, save_file

    source, target = Path(source), Path(target)
    if target.exists():
        raise FileExistsError(f"{target} exists; choose a new folder")
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("manifest.json", ".*"))
    generator = torch.Generator().manual_seed(seed)
    for path in target.glob("*.safetensors"):
        tensors = load_file(path)
        for key, tensor in tensors.items():
            if tensor.dim() == 2 and tensor.is_floating_point() and (only is None or only in key):
                scale = tensor.float().std() * noise
                tensors[key] = (tensor.float() + torch.randn(tensor.shape, generator=generator) * scale).to(
                    tensor.dtype
                )
        save_file(tensors, path, metadata={"format": "pt"})
    return target
