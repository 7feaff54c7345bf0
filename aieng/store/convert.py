"""``aieng model convert``: the one explicit door from pickle weights to safetensors.

Pickle files can execute code when unpickled; the store refuses them. Conversion loads them with
``torch.load(weights_only=True)`` (tensors only, no arbitrary objects), so even this door never
runs code from the file, and writes ``model.safetensors`` next to copies of the other files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from aieng.errors import StoreError
from aieng.store.introspect import PICKLE_SUFFIXES, find_pickle_files
from aieng.store.staging import occupied, staged_directory


def convert_to_safetensors(source: Path | str, out: Path | str) -> Path:
    import torch
    from safetensors.torch import save_file

    source, out = Path(source), Path(out)
    if not source.is_dir():
        raise StoreError(f"{source} is not a directory")
    if occupied(out):  # before the (slow) loading, and again at the rename
        raise _out_taken(out)
    pickles = _weight_pickles(source)
    if not pickles:
        raise StoreError(f"{source} has no pickle weights ({', '.join(PICKLE_SUFFIXES)}) to convert")

    tensors: dict[str, torch.Tensor] = {}
    for rel in pickles:
        try:
            state = torch.load(source / rel, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StoreError(
                f"{source / rel} could not be read as a tensors-only checkpoint ({exc}); "
                "aieng will not unpickle arbitrary objects"
            ) from exc
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise StoreError(f"{source / rel} is not a flat name -> tensor state dict")
        tensors.update(state)
    # safetensors refuses tensors that share memory (tied embeddings); give each its own copy.
    tensors = {k: v.detach().contiguous().clone() for k, v in tensors.items()}

    with staged_directory(out, exists_error=_out_taken) as tmp:
        skip = set(pickles) | {p for p in _rel_files(source) if p.endswith(".bin.index.json")}
        for rel in _rel_files(source):
            if rel in skip:
                continue
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, tmp / rel)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "converted_by": "aieng"})
    return out


def _out_taken(out: Path) -> StoreError:
    return StoreError(f"{out} already exists and is not empty; choose a new --out folder")


def _rel_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _weight_pickles(source: Path) -> list[str]:
    """Pickle weight files, in shard order when an index names them."""
    index = source / "pytorch_model.bin.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        return shards
    return find_pickle_files(source)
