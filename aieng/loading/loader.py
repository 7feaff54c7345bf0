"""Load a model version from the store: verify, refuse remote code, budget memory, then read weights.

The order matters: hashes are checked before any weight byte is parsed (a tampered file is never
deserialised), and the memory budget is checked before allocation (a model that cannot fit is
refused with numbers instead of being OOM-killed half-way).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from aieng.errors import AiengError, ModelLoadError
from aieng.loading.device import choose_device, choose_dtype, wants_cuda
from aieng.loading.memory import MemoryBudget, check_host_staging, check_memory_budget
from aieng.model_facts import model_context_length
from aieng.observability.metrics import MODEL_LOAD_ERRORS, MODEL_LOAD_SECONDS
from aieng.settings import DEFAULTS
from aieng.store import Manifest, ModelRef, ModelStore
from aieng.store.introspect import check_servable, inspect_folder, needs_remote_code, read_config


@dataclass(frozen=True)
class LoadConfig:
    device: str = DEFAULTS.device  # auto | cpu | cuda | cuda:N
    dtype: str = DEFAULTS.dtype  # auto | float32 | bfloat16 | float16
    memory_headroom: float = DEFAULTS.memory_headroom  # share of available RAM the weights may use
    gpu_memory_fraction: float = DEFAULTS.gpu_memory_fraction  # share of GPU memory the weights may use
    # Weights split layer by layer across GPUs (transformers' device_map="auto"): device index ->
    # bytes allowed there. Set by the worker plan when one GPU is too small (aieng.host.gpus.split_plan).
    max_memory: dict[int, int] | None = None

    @classmethod
    def from_settings(cls, settings) -> LoadConfig:
        return cls(
            device=settings.device,
            dtype=settings.dtype,
            memory_headroom=settings.memory_headroom,
            gpu_memory_fraction=settings.gpu_memory_fraction,
        )

    def full_precision(self) -> LoadConfig:
        """``auto`` on the CPU as float32, also for a bf16 checkpoint (which ``auto`` keeps in bf16
        for serving): what evaluation grades, the baseline each weight format's delta is against."""
        if self.dtype == "auto" and not wants_cuda(self.device):
            return replace(self, dtype="float32")
        return self


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    path: Path
    name: str
    version: str | None
    manifest: Manifest | None
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    budget: MemoryBudget

    @property
    def context_length(self) -> int:
        return model_context_length(self.model)


def load_version(store: ModelStore, ref: ModelRef, config: LoadConfig = LoadConfig()) -> LoadedModel:
    """Verify every hash of ``ref`` and load it; failures are counted and re-raised unchanged."""
    start = time.perf_counter()
    version = ref.version or "-"  # the label of a failure to resolve ``current``
    try:
        version = store.resolve(ref)
        for code in ("verification_failed", "insufficient_memory", "internal_error"):
            MODEL_LOAD_ERRORS.labels(model=ref.name, version=version, code=code)  # zeros: rate() works from the start
        resolved = ModelRef(ref.name, version)
        store.verify_or_raise(resolved)
        path = store.version_dir(ref.name, version)
        manifest = Manifest.read(path)
        loaded = _load(
            path, label=str(resolved), num_parameters=manifest.num_parameters, stored=manifest.dtype, config=config
        )
    except AiengError as exc:
        MODEL_LOAD_ERRORS.labels(model=ref.name, version=version, code=exc.code).inc()
        raise
    except Exception:
        MODEL_LOAD_ERRORS.labels(model=ref.name, version=version, code="internal_error").inc()
        raise
    elapsed = time.perf_counter() - start
    MODEL_LOAD_SECONDS.labels(model=ref.name, version=version).observe(elapsed)
    loaded.name, loaded.version, loaded.manifest, loaded.load_seconds = ref.name, version, manifest, elapsed
    return loaded


def load_folder(path: Path | str, config: LoadConfig = LoadConfig(), *, name: str | None = None) -> LoadedModel:
    """Load an unregistered local folder (benchmarks, notebooks): same safety rules, no hash check."""
    path = Path(path)
    start = time.perf_counter()
    facts = inspect_folder(path)
    loaded = _load(path, label=str(path), num_parameters=facts.num_parameters, stored=facts.dtype, config=config)
    loaded.name = name or path.name
    loaded.load_seconds = time.perf_counter() - start
    return loaded


def _load(path: Path, *, label: str, num_parameters: int, stored: str, config: LoadConfig) -> LoadedModel:
    """``stored``: the checkpoint's dtype, as registration read it from the safetensors headers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder_config = read_config(path)
    if needs_remote_code(folder_config):
        raise ModelLoadError(
            f"{label} needs trust_remote_code, which aieng never enables; "
            "serve a model whose architecture transformers ships",
            code="remote_code_refused",
        )
    device = choose_device(config.device)
    dtype = choose_dtype(config.dtype, device, stored if _native_serves(path, folder_config) else None)
    split = config.max_memory is not None and device.type == "cuda"
    if split:  # split_plan checked the sum over the GPUs; each one's share is its max_memory
        device = torch.device("cuda", min(config.max_memory))
        budget = MemoryBudget(
            device="cuda (split)",
            needed_bytes=num_parameters * dtype.itemsize,
            allowed_bytes=sum(config.max_memory.values()),
            detail=f"split across {len(config.max_memory)} GPUs",
        )
    else:
        budget = check_memory_budget(
            label,
            num_parameters,
            dtype,
            device,
            memory_headroom=config.memory_headroom,
            gpu_memory_fraction=config.gpu_memory_fraction,
        )
    if device.type == "cuda":  # the weights go straight to the GPU: host RAM holds a shard's tensors at most
        check_host_staging(label, path, memory_headroom=config.memory_headroom)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    if split:
        placement = {"device_map": "auto", "max_memory": dict(config.max_memory)}
    else:  # on CUDA each tensor is read from its file to the device, never the whole state dict in RAM first
        placement = {"device_map": str(device)} if device.type == "cuda" else {}
    model = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=dtype, **placement
    )
    model.eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs a pad id; eos is the usual stand-in
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=path,
        name=path.name,
        version=None,
        manifest=None,
        device=device,
        dtype=dtype,
        load_seconds=0.0,
        budget=budget,
    )


def _native_serves(path: Path, folder_config: dict) -> bool:
    """The native forward serves it, which reads bf16 weights as they are (``device.choose_dtype``);
    the transformers forward runs a model in the dtype it loads in."""
    try:
        return check_servable(folder_config, path) == "native"
    except AiengError:  # a folder the store would refuse: transformers' own load says why
        return False
